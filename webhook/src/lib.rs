//! Mutating admission webhook that taints Nodes until their network agent is ready.
//!
//! The modules form layers; each uses only the ones above it in this list:
//!
//! * [`rules`]: the decision, pure (kube's `AdmissionRequest` and the shared
//!   `NodeView` in, taints, patch and follow-up jobs out), and the rules
//!   named ([`rules::Rule`]); [`caller`]: which reviews may have those jobs
//!   done (pure).
//! * [`review`]: AdmissionReview bytes in (kube's types, serde) and out.
//! * [`metrics`]: Prometheus metrics.
//! * [`patcher`]: the background reboot patches and the re-registration check;
//!   [`claims`]: its claims of a reboot, rate-limited per node and checked
//!   against the stored node.
//! * [`admission`]: one review start to end (decode, decide, count, encode).
//! * [`limits`], [`body`], [`refusal`]: what one request may cost;
//!   [`app`]: the HTTP routes within those limits.
//! * [`tls`], [`serve`]: the reloading certificate, the TLS/HTTP stack
//!   (reused by the performance harness), with the connection cap of
//!   `nodegate_shared::connection_gate`.
//! * [`config`] and this crate root: flags, and starting it all.
//!
//! [`render`] prints manifests instead of serving (below [`config`], which
//! names its subcommands; it uses only [`rules`]). `fixtures` (cargo feature
//! `fixtures`, off in the shipped build) holds the realistic Nodes and
//! reviews the tests and benches share.

pub mod admission;
pub mod app;
pub mod body;
pub mod caller;
pub mod claims;
pub mod config;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod limits;
pub mod metrics;
pub mod patcher;
pub mod refusal;
pub mod render;
pub mod review;
pub mod rules;
pub mod serve;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{Args, Config, KubeMode};
/// The renderers at the paths other crates have always used.
pub use render::{confinement, policy, webhook_config};

use crate::admission::Webhook;
use crate::app::{Health, admin_router, webhook_router};
use crate::caller::{Authority, TokenFile};
use crate::metrics::{Metrics, Port};
use crate::patcher::RebootPatcher;
use crate::rules::Rules;
use crate::serve::{
    ServeOptions, crypto_provider, serve_http_with, serve_https_with, tls_server_config,
};
use crate::tls::CertReloader;

/// The admin port's header read (and idle) timeout: Prometheus and the
/// kubelet send a small GET at once; an idle scrape connection is reopened.
const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A started webhook.
#[derive(Debug)]
pub struct Running {
    pub https_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Waits until the servers have drained after shutdown.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("webhook task panicked")?
    }
}

/// Binds both ports, loads the certificate and starts serving; returns once
/// the webhook accepts connections. Logs
/// `listening https=<addr> admin=<addr>`. Stops when `shutdown` resolves:
/// readiness turns false, requests are still served for the shutdown delay,
/// then no new connections and in-flight requests finish (up to the
/// shutdown timeout).
pub async fn start(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Running> {
    let rules = Arc::new(
        Rules::with_owned(config.taints.clone(), config.owned_taints.clone())
            .context("invalid --taint or --owned-taint")?,
    );
    let metrics = Arc::new(Metrics::new());

    let reloader = Arc::new(
        CertReloader::load(&config.tls_cert, &config.tls_key, crypto_provider())
            .context("loading the serving certificate")?,
    );
    let tls = tls_server_config(reloader.clone()).context("building the TLS config")?;

    let (listener, admin) = bind(&config).await?;
    let https_addr = listener.local_addr()?;
    let admin_addr = admin.local_addr()?;

    let (patcher, patcher_task) = match kube_client(config.kube).await {
        Some(c) => {
            let (p, t) = RebootPatcher::spawn(c, rules.clone(), metrics.clone(), config.patcher);
            (p, Some(t))
        }
        None => (RebootPatcher::disabled(metrics.clone()), None),
    };

    // One shutdown signal fanned out to the servers and the reloader.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let watcher =
        reloader
            .clone()
            .spawn_watcher(config.tls_reload_interval, metrics.clone(), stopped());

    let health = Arc::new(Health::default());
    let authority = Arc::new(TokenFile::load(config.path_token_file.clone()));
    log_authority(&authority.current());
    metrics.path_tokens(&authority.current());
    let hook = Arc::new(Webhook {
        rules,
        patcher,
        metrics: metrics.clone(),
        authority: authority.clone(),
    });
    let token_task = tokio::spawn(reload_token(
        authority,
        metrics.clone(),
        config.tls_reload_interval,
        stopped(),
    ));
    let opts = ServeOptions {
        handshake_timeout: config.tls_handshake_timeout,
        header_read_timeout: config.header_read_timeout,
        drain_timeout: config.shutdown_timeout,
        max_connections: config.max_connections,
        h2_max_concurrent_streams: config.h2_max_concurrent_streams,
        metrics: Some((metrics.clone(), Port::Https)),
        ..ServeOptions::default()
    };
    let https = tokio::spawn(serve_https_with(
        listener,
        tls,
        webhook_router(hook, config.limits),
        stopped(),
        opts,
    ));
    // Scrapers and probes send a GET and read a few KB: short timeouts.
    let admin_opts = ServeOptions {
        header_read_timeout: ADMIN_HEADER_READ_TIMEOUT,
        drain_timeout: config.shutdown_timeout,
        max_connections: config.admin_max_connections,
        metrics: Some((metrics.clone(), Port::Admin)),
        ..ServeOptions::default()
    };
    let admin_task = tokio::spawn(serve_http_with(
        admin,
        admin_router(health.clone(), metrics.clone()),
        stopped(),
        admin_opts,
    ));
    health.set_ready(true);
    let shutdown_delay = config.shutdown_delay;
    tracing::info!("listening https={https_addr} admin={admin_addr}");

    let task = tokio::spawn(async move {
        shutdown.await;
        health.set_ready(false);
        if !shutdown_delay.is_zero() {
            tracing::info!(delay = ?shutdown_delay, "shutting down: not ready, still serving until endpoints catch up");
            tokio::time::sleep(shutdown_delay).await;
        }
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
        let https = https.await.context("https server panicked")?;
        let admin = admin_task.await.context("admin server panicked")?;
        let _ = watcher.await;
        if let Some(t) = patcher_task {
            t.abort();
        }
        token_task.abort();
        https.context("https server")?;
        admin.context("admin server")?;
        tracing::info!("stopped");
        Ok(())
    });
    Ok(Running {
        https_addr,
        admin_addr,
        metrics,
        task,
    })
}

/// Binds the HTTPS and the admin listener; says when one binds every address
/// of the host.
async fn bind(config: &Config) -> anyhow::Result<(TcpListener, TcpListener)> {
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding --listen {}", config.listen))?;
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("binding --admin-listen {}", config.admin_listen))?;
    for (flag, addr) in [
        ("--listen", config.listen),
        ("--admin-listen", config.admin_listen),
    ] {
        if addr.ip().is_unspecified() {
            tracing::warn!(%addr, "{flag} binds every address of the host; set POD_IP (--bind-address) to bind only the pod's");
        }
    }
    Ok((listener, admin))
}

/// The background patcher's client; without one the patches are skipped
/// (and counted), which is said once here.
async fn kube_client(mode: KubeMode) -> Option<kube::Client> {
    match mode {
        KubeMode::Disabled => {
            tracing::warn!("reboot patches after status writes are disabled (counted as skipped)");
            None
        }
        KubeMode::Client(c) => Some(c),
        KubeMode::Infer => match kube::Client::try_default().await {
            Ok(c) => Some(c),
            Err(err) => {
                tracing::warn!(%err, "no cluster credentials: reboot patches after status writes are disabled (counted as skipped)");
                None
            }
        },
    }
}

/// Says at start which reviews may write a stored Node.
fn log_authority(authority: &Authority) {
    match authority {
        Authority::Open => tracing::warn!(
            "no --path-token-file: any review, forged ones included, may make the webhook re-taint a stored Node (docs/security.md)"
        ),
        Authority::Token(tokens) => {
            tracing::info!(
                tokens = tokens.len(),
                "only reviews posted to /mutate/<token> may write a stored Node"
            )
        }
        Authority::Missing(why) => {
            tracing::error!(%why, "--path-token-file unusable (read again every --tls-reload-interval): no review may write a stored Node, so a re-registering node is gated only by its create and a reboot seen on a status write is not re-tainted")
        }
    }
}

/// Reads the path token file again every `every` until `stop`, and says
/// when what it admits changed.
async fn reload_token(
    file: Arc<TokenFile>,
    metrics: Arc<Metrics>,
    every: std::time::Duration,
    stop: impl Future<Output = ()>,
) {
    let reload = async {
        loop {
            tokio::time::sleep(every).await;
            let changed = file.reload();
            if let Some(now) = &changed {
                metrics.path_tokens(now);
            }
            match changed {
                Some(Authority::Token(tokens)) => {
                    tracing::info!(
                        tokens = tokens.len(),
                        "path token read: only reviews posted to /mutate/<token> may write a stored Node"
                    )
                }
                Some(Authority::Missing(why)) => {
                    tracing::error!(%why, "--path-token-file unusable: no review may write a stored Node")
                }
                Some(Authority::Open) | None => {}
            }
        }
    };
    tokio::select! {
        () = reload => {}
        () = stop => {}
    }
}

/// [`start`] from command-line arguments, then wait for shutdown to finish.
pub async fn run(
    args: Args,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let config = Config::try_from(args)?;
    start(config, shutdown).await?.wait().await
}
