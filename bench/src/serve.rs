//! HTTPS serving for the baseline: accept, TLS handshake, HTTP/1.1 or h2
//! (by ALPN) into an axum router, graceful drain on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// How long a client may take for the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests may take to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve_https(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10));
    let http = Arc::new(http);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, http, router) = (acceptor.clone(), http.clone(), router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = TowerToHyperService::new(router);
            let conn = http.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("draining connections");
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out");
    }
    Ok(())
}
