//! The shared serving layer (`nodegate_webhook::serve`) drains on shutdown:
//! it stops accepting, lets an in-flight request finish, and gives up on
//! connections that outlive the drain timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use common::*;
use nodegate_certs::Ca;
use nodegate_webhook::serve::{ServeOptions, crypto_provider, serve_https_with, tls_server_config};
use nodegate_webhook::tls::CertReloader;
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

struct Slow {
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

/// `POST /slow` signals `entered`, then waits for `release`.
fn slow_router(s: &Slow) -> Router {
    let (entered, release) = (s.entered.clone(), s.release.clone());
    Router::new().route(
        "/slow",
        post(move || {
            let (entered, release) = (entered.clone(), release.clone());
            async move {
                entered.notify_one();
                release.notified().await;
                "done"
            }
        }),
    )
}

async fn setup(
    drain: Duration,
) -> (
    SecretDir,
    std::net::SocketAddr,
    Slow,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let ca = Ca::generate(1).unwrap();
    let leaf = ca.issue(&serving_request()).unwrap();
    let secret = SecretDir::new(&leaf, ca);
    let reloader =
        CertReloader::load(secret.cert_path(), secret.key_path(), crypto_provider()).unwrap();
    let tls = tls_server_config(Arc::new(reloader)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let slow = Slow {
        entered: Arc::new(Notify::new()),
        release: Arc::new(Notify::new()),
    };
    let (stop, rx) = oneshot::channel::<()>();
    let opts = ServeOptions {
        drain_timeout: drain,
        ..ServeOptions::default()
    };
    let server = tokio::spawn(serve_https_with(
        listener,
        tls,
        slow_router(&slow),
        async move {
            let _ = rx.await;
        },
        opts,
    ));
    (secret, addr, slow, stop, server)
}

#[tokio::test]
async fn in_flight_request_finishes_after_shutdown() {
    let (secret, addr, slow, stop, server) = setup(Duration::from_secs(30)).await;
    let cfg = client_config(secret.ca.cert_pem(), &[b"http/1.1"]);
    let mut c = H1::open(addr, &cfg).await.unwrap();
    let request = tokio::spawn(async move { c.post("/slow", b"x".to_vec()).await });
    slow.entered.notified().await;

    stop.send(()).unwrap();
    eventually("listener closed", 10, || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(
        !server.is_finished(),
        "returned before the in-flight request finished"
    );

    slow.release.notify_one();
    let (status, body) = request.await.unwrap().unwrap();
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"done");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server returns once drained")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn drain_gives_up_after_its_timeout() {
    let (secret, addr, slow, stop, server) = setup(Duration::from_millis(200)).await;
    let cfg = client_config(secret.ca.cert_pem(), &[b"http/1.1"]);
    let mut c = H1::open(addr, &cfg).await.unwrap();
    let _request = tokio::spawn(async move { c.post("/slow", b"x".to_vec()).await });
    slow.entered.notified().await;
    let started = Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server returns after the drain timeout")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
}
