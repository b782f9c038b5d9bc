//! Each bound on what a connection or request may cost is enforced, counted,
//! and leaves a well-behaved client served. Small limits come in through the
//! configuration; every wait has a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use nodegate_certs::Ca;
use nodegate_webhook::fixtures::kubelet_create;
use nodegate_webhook::{Config, Running, start};
use rustls::ClientConfig;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

struct Harness {
    secret: SecretDir,
    running: Running,
    stop: oneshot::Sender<()>,
}

impl Harness {
    async fn new(tune: impl FnOnce(&mut Config)) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("nodegate_webhook=debug")
            .try_init();
        let ca = Ca::generate(1).unwrap();
        let leaf = ca.issue(&serving_request()).unwrap();
        let secret = SecretDir::new(&leaf, ca);
        let mut config = Config::local(secret.cert_path(), secret.key_path());
        config.shutdown_timeout = Duration::from_secs(2);
        tune(&mut config);
        let (stop, rx) = oneshot::channel::<()>();
        let running = start(config, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
        Self {
            secret,
            running,
            stop,
        }
    }

    fn cfg(&self) -> Arc<ClientConfig> {
        client_config(self.secret.ca.cert_pem(), &[b"http/1.1"])
    }

    fn addr(&self) -> SocketAddr {
        self.running.https_addr
    }

    async fn metric(&self, series: &str) -> u64 {
        let (_, text) = get(self.running.admin_addr, "/metrics").await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.running.wait().await.unwrap();
    }
}

fn refused(reason: &str) -> String {
    format!("nodegate_webhook_refused_total{{port=\"https\",reason=\"{reason}\"}}")
}

fn review_bytes(uid: &str) -> Vec<u8> {
    serde_json::to_vec(&kubelet_create(uid, "n1")).unwrap()
}

async fn served(c: &mut H1, uid: &str) {
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(10),
        c.post("/mutate", review_bytes(uid)),
    )
    .await
    .expect("answer within 10 s")
    .unwrap();
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["uid"], uid);
    assert_eq!(v["response"]["patchType"], "JSONPatch");
}

/// Reads what the server sends until it closes, within `within`.
async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> String {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(within, s.read_to_end(&mut buf))
        .await
        .expect("the server closed the connection");
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test]
async fn an_oversized_review_is_allowed_untouched_with_a_413_status_and_counted() {
    let h = Harness::new(|c| c.limits.max_body_bytes = 64 * 1024).await;
    let mut c = H1::open(h.addr(), &h.cfg()).await.unwrap();
    // The API server's field order: the uid comes first, so it can be answered.
    let big = format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u-big","object":{{"pad":"{}"}}}}}}"#,
        "x".repeat(100 * 1024)
    );
    let (status, body) = c.post("/mutate", big.into_bytes()).await.unwrap();
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(body.len() < 1024, "answer of {} bytes", body.len());
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    let r = &v["response"];
    assert_eq!(r["uid"], "u-big");
    assert_eq!(r["allowed"], true);
    assert_eq!(r["status"]["code"], 413);
    assert!(r.get("patch").is_none());
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap()
            .contains("65536-byte limit")
    );

    // No uid to answer: a plain 413.
    let mut c = H1::open(h.addr(), &h.cfg()).await.unwrap();
    let (status, _) = c.post("/mutate", vec![b' '; 100 * 1024]).await.unwrap();
    assert_eq!(status, 413);

    // A review within the limit, on a new connection, is served as usual.
    let mut c = H1::open(h.addr(), &h.cfg()).await.unwrap();
    served(&mut c, "u-ok").await;
    assert_eq!(h.metric(&refused("body_too_large")).await, 2);
    h.stop().await;
}

#[tokio::test]
async fn slow_headers_and_slow_bodies_are_dropped_after_their_timeouts() {
    let h = Harness::new(|c| {
        c.header_read_timeout = Duration::from_millis(300);
        c.limits.body_read_timeout = Duration::from_millis(300);
    })
    .await;
    let cfg = h.cfg();
    // Slowloris: part of a head, then nothing.
    let (mut tls, _) = connect(h.addr(), &cfg).await.unwrap();
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    read_until_closed(&mut tls, Duration::from_secs(10)).await;
    assert!(started.elapsed() >= Duration::from_millis(250));

    // Slow body: a whole head, a tenth of the body.
    let (mut tls, _) = connect(h.addr(), &cfg).await.unwrap();
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"kind\":")
        .await
        .unwrap();
    let started = Instant::now();
    let answer = read_until_closed(&mut tls, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(250));

    let mut c = H1::open(h.addr(), &cfg).await.unwrap();
    served(&mut c, "u-ok").await;
    assert_eq!(h.metric(&refused("header_timeout")).await, 1);
    assert_eq!(h.metric(&refused("body_timeout")).await, 1);
    h.stop().await;
}

#[tokio::test]
async fn at_the_connection_cap_new_connections_are_closed_and_the_open_one_is_served() {
    const CAP: usize = 4;
    // Loopback peers also get the reserve kept for this host.
    const RESERVE: usize = 16;
    let h = Harness::new(|c| c.max_connections = CAP).await;
    let cfg = h.cfg();
    let mut client = H1::open(h.addr(), &cfg).await.unwrap();
    served(&mut client, "u-1").await;
    let mut held = Vec::new();
    for _ in 1..CAP + RESERVE {
        held.push(connect(h.addr(), &cfg).await.unwrap().0);
    }
    // One more: closed as soon as accepted, so the handshake fails.
    let refused_now = tokio::time::timeout(Duration::from_secs(10), connect(h.addr(), &cfg))
        .await
        .expect("refused at once, not left hanging");
    assert!(refused_now.is_err(), "a connection over the cap was served");
    assert!(h.metric(&refused("connection_limit")).await >= 1);
    assert_eq!(
        h.metric("nodegate_webhook_open_connections{port=\"https\"}")
            .await,
        (CAP + RESERVE) as u64
    );
    // The connection that was already open is still served.
    served(&mut client, "u-2").await;
    // A slot freed is a slot to use again.
    drop(held.pop());
    let addr = h.addr();
    eventually("a new connection once one closed", 10, || {
        let cfg = cfg.clone();
        async move { H1::open(addr, &cfg).await.is_ok() }
    })
    .await;
    drop(held);
    h.stop().await;
}

#[tokio::test]
async fn in_flight_requests_wait_for_a_slot_within_the_request_deadline() {
    let h = Harness::new(|c| {
        c.limits.max_inflight = 1;
        c.limits.request_timeout = Duration::from_millis(1500);
        c.limits.body_read_timeout = Duration::from_secs(10);
    })
    .await;
    let cfg = h.cfg();
    // Takes the only slot: a head and a partial body.
    let (mut slow, _) = connect(h.addr(), &cfg).await.unwrap();
    slow.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        .await
        .unwrap();
    let addr = h.addr();
    eventually("the slow request holds the slot", 10, || async {
        h.metric("nodegate_webhook_inflight_requests").await == 1
    })
    .await;
    // Waits for the slot, which frees when the slow request's deadline
    // passes (every request ahead in line has an earlier deadline).
    let mut c = H1::open(addr, &cfg).await.unwrap();
    let started = Instant::now();
    let (status, _) = c.post("/mutate", review_bytes("u-late")).await.unwrap();
    assert_eq!(status, 200);
    assert!(started.elapsed() >= Duration::from_millis(1000));
    // Its body could not finish before the deadline: 408 (or 503 when the
    // request deadline fires first; both bound it at the same instant).
    let answer = read_until_closed(&mut slow, Duration::from_secs(10)).await;
    assert!(
        answer.starts_with("HTTP/1.1 408") || answer.starts_with("HTTP/1.1 503"),
        "{answer}"
    );
    let cut =
        h.metric(&refused("request_timeout")).await + h.metric(&refused("body_timeout")).await;
    assert_eq!(cut, 1);

    // A waiting request proceeds as soon as the slot frees.
    let (mut slow, _) = connect(addr, &cfg).await.unwrap();
    slow.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        .await
        .unwrap();
    eventually("the slow request holds the slot again", 10, || async {
        h.metric("nodegate_webhook_inflight_requests").await == 1
    })
    .await;
    let mut c = H1::open(addr, &cfg).await.unwrap();
    let waiting = tokio::spawn(async move {
        served(&mut c, "u-next").await;
    });
    drop(slow);
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once the slot freed")
        .unwrap();
    h.stop().await;
}

#[tokio::test]
async fn a_spent_body_budget_answers_503_until_bytes_are_released() {
    let h = Harness::new(|c| {
        c.limits.body_buffer_bytes = 64 * 1024;
        c.limits.body_read_timeout = Duration::from_secs(10);
        c.limits.request_timeout = Duration::from_secs(10);
    })
    .await;
    let cfg = h.cfg();
    // Holds 60 KiB of the 64 KiB budget, never finishing its body.
    let (mut hog, _) = connect(h.addr(), &cfg).await.unwrap();
    hog.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .await
        .unwrap();
    hog.write_all(&vec![b' '; 60 * 1024]).await.unwrap();
    hog.flush().await.unwrap();
    let addr = h.addr();
    // A 26 KB review does not fit next to it.
    eventually("503 while the budget is held", 10, || {
        let cfg = cfg.clone();
        async move {
            let mut c = H1::open(addr, &cfg).await.unwrap();
            matches!(c.post("/mutate", review_bytes("u-x")).await, Ok((s, _)) if s == 503)
        }
    })
    .await;
    assert!(h.metric(&refused("body_budget")).await >= 1);
    drop(hog);
    eventually("served once the bytes are released", 10, || {
        let cfg = cfg.clone();
        async move {
            let mut c = H1::open(addr, &cfg).await.unwrap();
            matches!(c.post("/mutate", review_bytes("u-y")).await, Ok((s, _)) if s == 200)
        }
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn idle_http2_connections_are_closed_after_the_idle_limit() {
    let h = Harness::new(|c| c.header_read_timeout = Duration::from_millis(300)).await;
    let cfg = client_config(h.secret.ca.cert_pem(), &[b"h2"]);
    let (tls, _) = connect(h.addr(), &cfg).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (_send, conn) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Full<bytes::Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .unwrap();
    // The connection task ends once the server's GOAWAY closes it.
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("idle HTTP/2 connection closed by the server")
        .ok();
    assert!(started.elapsed() >= Duration::from_millis(250));
    h.stop().await;
}

#[tokio::test]
async fn the_admin_port_serves_only_its_endpoints() {
    let h = Harness::new(|_| {}).await;
    let admin = h.running.admin_addr;
    for path in ["/livez", "/readyz", "/metrics"] {
        assert_eq!(get(admin, path).await.unwrap().0, 200, "{path}");
    }
    for path in ["/", "/mutate", "/debug/pprof"] {
        assert_eq!(get(admin, path).await.unwrap().0, 404, "{path}");
    }
    h.stop().await;
}
