//! The transport limit: the webhook's own TLS + HTTP stack
//! (`nodegate_webhook::serve`, its reloading certificate resolver, the same
//! body limit) answering a fixed AdmissionReview without parsing the request.
//! The body is still read in full, as the webhook must.

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
use nodegate_webhook::serve;
use nodegate_webhook::tls::CertReloader;
use tokio::net::TcpListener;

/// The answer to every request: allowed, nothing to patch.
pub const FIXED_REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-0000-0000-000000000000","allowed":true}}"#;

/// Same request body limit as the webhook.
pub const BODY_LIMIT: usize = nodegate_webhook::app::BODY_LIMIT;

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

/// Serves until SIGTERM or Ctrl-C; prints `listening https=ADDR` once bound.
pub async fn run(args: Args) -> anyhow::Result<()> {
    // Handlers first, as in the webhook: a stop while starting is kept.
    let shutdown = nodegate_shared::signal::shutdown();
    let resolver = CertReloader::load(&args.tls_cert, &args.tls_key, serve::crypto_provider())
        .context("loading the serving certificate")?;
    let tls = serve::tls_server_config(Arc::new(resolver)).context("TLS config")?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!("listening https={}", listener.local_addr()?);
    serve::serve_https(listener, tls, router(), shutdown).await?;
    Ok(())
}
