//! The harness against real servers in-process: every request answered and
//! checked, none failed. Counts only; no timing is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use nodegate_bench::certdir::{CertDir, RotateStyle};
use nodegate_bench::client::{Proto, Target};
use nodegate_bench::fixtures::{self, Workload};
use nodegate_bench::load::{self, LoadConfig};
use nodegate_webhook::{Config, Running, start};
use tokio::sync::oneshot;

/// The webhook in-process; it runs until the returned sender fires.
async fn start_webhook(config: Config) -> (Running, oneshot::Sender<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let running = start(config, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    (running, stop)
}

fn config(workload: Workload, requests: u64, webhook: bool) -> LoadConfig {
    LoadConfig {
        connections: 4,
        rate: None,
        duration: None,
        requests: Some(requests),
        fixtures: Arc::new(fixtures::workload(workload)),
        webhook,
        reconnect_after: None,
        timeout: Duration::from_secs(10),
        server_pid: Some(std::process::id()),
        sample_every: Duration::from_millis(50),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_answers_every_review_with_a_patch() {
    let certs = CertDir::new(RotateStyle::Secret).unwrap();
    let (running, stop) = start_webhook(Config::local(certs.cert_path(), certs.key_path())).await;
    for proto in [Proto::H1, Proto::H2] {
        let target = Target::new(running.https_addr, certs.ca_pem(), proto).unwrap();
        let r = load::run(&target, &config(Workload::Mix, 200, true)).await;
        assert_eq!(r.failures.total(), 0, "{proto:?}: {}", r.failures);
        assert_eq!(r.ok, 200);
        assert_eq!(r.latency.count(), 200);
        // Keep-alive: at most one connection per worker.
        assert!((1..=4).contains(&r.connects), "{}", r.connects);
        assert!(r.server.is_some() && !r.memory.is_empty());
    }
    // Open loop with a request count: all sent, all checked.
    let target = Target::new(running.https_addr, certs.ca_pem(), Proto::H1).unwrap();
    let mut cfg = config(Workload::Create, 50, true);
    cfg.rate = Some(2000.0);
    cfg.reconnect_after = Some(10);
    let r = load::run(&target, &cfg).await;
    assert_eq!((r.ok, r.failures.total()), (50, 0), "{}", r.failures);
    assert!(
        r.connects >= 5,
        "reconnects every 10 requests: {}",
        r.connects
    );
    let _ = stop.send(());
    running.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_a_server_that_is_not_the_webhook() {
    // The baseline never echoes the uid nor patches: as a webhook it must fail.
    let certs = CertDir::new(RotateStyle::Secret).unwrap();
    let resolver = nodegate_webhook::tls::CertReloader::load(
        certs.cert_path(),
        certs.key_path(),
        nodegate_webhook::serve::crypto_provider(),
    )
    .unwrap();
    let tls = nodegate_webhook::serve::tls_server_config(Arc::new(resolver)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(nodegate_webhook::serve::serve_https(
        listener,
        tls,
        nodegate_bench::baseline::router(),
        async move {
            let _ = stopped.await;
        },
    ));
    let target = Target::new(addr, certs.ca_pem(), Proto::H1).unwrap();
    let r = load::run(&target, &config(Workload::Create, 40, false)).await;
    assert_eq!((r.ok, r.failures.total()), (40, 0), "{}", r.failures);
    let r = load::run(&target, &config(Workload::Create, 40, true)).await;
    assert_eq!(r.ok, 0);
    assert_eq!(r.failures.total(), 40);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_wrong_ca_fails_to_connect() {
    let certs = CertDir::new(RotateStyle::Secret).unwrap();
    let other = CertDir::new(RotateStyle::Secret).unwrap();
    let (running, stop) = start_webhook(Config::local(certs.cert_path(), certs.key_path())).await;
    let target = Target::new(running.https_addr, other.ca_pem(), Proto::H1).unwrap();
    let err = target.connect().await.err().expect("untrusted server");
    assert!(format!("{err:#}").contains("TLS handshake"), "{err:#}");
    let _ = stop.send(());
    running.wait().await.unwrap();
}

/// Both ways a certificate gets replaced on disk reach new connections,
/// through the file watcher (the periodic re-check is set far beyond the deadline).
#[tokio::test]
async fn rotated_certificates_are_served_to_new_connections() {
    for style in [RotateStyle::Files, RotateStyle::Secret] {
        let mut certs = CertDir::new(style).unwrap();
        let mut config = Config::local(certs.cert_path(), certs.key_path());
        config.tls_reload_interval = Duration::from_secs(3600);
        let (running, stop) = start_webhook(config).await;
        let target = Target::new(running.https_addr, certs.ca_pem(), Proto::H1).unwrap();
        let first = target.leaf_fingerprint().await.unwrap();
        certs.rotate(style).unwrap();
        // Poll until the server serves the new leaf (deadline, no fixed sleep).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if target.leaf_fingerprint().await.unwrap() != first {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{style:?}: new cert never served"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(());
        running.wait().await.unwrap();
    }
}
