//! The transport limit: the webhook's TLS + HTTP stack answering a fixed
//! AdmissionReview without parsing the request (the body is still read in
//! full, as the webhook must).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

/// The answer to every request: allowed, nothing to patch.
pub const FIXED_REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-0000-0000-000000000000","allowed":true}}"#;

/// Same request body limit as the webhook.
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

#[derive(Debug, clap::Parser)]
#[command(
    name = "nodegate-baseline",
    about = "Transport-limit server: nodegate's TLS + HTTP stack with a fixed answer"
)]
pub struct Args {
    /// Address to serve HTTPS on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    #[arg(long)]
    pub tls_cert: PathBuf,
    #[arg(long)]
    pub tls_key: PathBuf,
}

/// `POST /mutate`: read the body, answer the fixed review.
pub fn router() -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

async fn mutate(body: Bytes) -> impl IntoResponse {
    // The body is fully received by the extractor; only its length is used.
    std::hint::black_box(body.len());
    ([(header::CONTENT_TYPE, "application/json")], FIXED_REVIEW)
}

/// TLS settings as the webhook serves: TLS 1.2/1.3, ALPN h2 + http/1.1.
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .context("parsing the certificate PEM")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).context("parsing the key PEM")?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .context("certificate and key do not form a pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves until SIGTERM or Ctrl-C; prints `listening https=ADDR` once bound.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let cert = tokio::fs::read(&args.tls_cert)
        .await
        .with_context(|| format!("reading {}", args.tls_cert.display()))?;
    let key = tokio::fs::read(&args.tls_key)
        .await
        .with_context(|| format!("reading {}", args.tls_key.display()))?;
    let tls = tls_config(&cert, &key)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(https = %listener.local_addr()?, "listening");
    crate::serve::serve_https(listener, tls, router(), shutdown_signal()).await
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
