//! The webhook over real TLS: verified like the API server verifies it,
//! answering reviews, surviving certificate rotations (good and bad) under
//! load without a single failed request, and shutting down cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use common::*;
use nodegate_certs::Ca;
use nodegate_webhook::fixtures::{kubelet_create, node_controller_update_after_reboot};
use nodegate_webhook::{Config, Running, start};
use rustls::ClientConfig;
use serde_json::Value;
use tokio::sync::oneshot;

struct Harness {
    secret: SecretDir,
    running: Running,
    stop: oneshot::Sender<()>,
    leaf_pem: String,
}

async fn harness() -> Harness {
    harness_with(|_| {}).await
}

async fn harness_with(tune: impl FnOnce(&mut Config)) -> Harness {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("nodegate_webhook=debug")
        .try_init();
    let ca = Ca::generate(1).unwrap();
    let leaf = ca.issue(&serving_request()).unwrap();
    let secret = SecretDir::new(&leaf, ca);
    let mut config = Config::local(secret.cert_path(), secret.key_path());
    config.tls_reload_interval = Duration::from_millis(500);
    config.shutdown_timeout = Duration::from_secs(5);
    tune(&mut config);
    let (stop, rx) = oneshot::channel::<()>();
    let running = start(config, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    Harness {
        secret,
        running,
        stop,
        leaf_pem: leaf.cert_pem,
    }
}

/// Checks a wire answer to `kubelet_create(uid, ..)`: allowed, uid echoed,
/// base64 JSONPatch adding the taint, a warning.
fn check_create_answer(body: &[u8], uid: &str) -> Result<(), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let r = &v["response"];
    let ok = v["apiVersion"] == "admission.k8s.io/v1"
        && v["kind"] == "AdmissionReview"
        && r["uid"] == uid
        && r["allowed"] == true
        && r["patchType"] == "JSONPatch"
        && r["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("nodegate.dev/agent-not-ready"));
    let patch = r["patch"]
        .as_str()
        .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p).ok())
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    if ok && patch.is_some_and(|p| p[0]["path"] == "/spec/taints/0") {
        Ok(())
    } else {
        Err(format!("unexpected answer {v}"))
    }
}

#[tokio::test]
async fn serves_reviews_over_verified_tls_on_http1_and_h2() {
    let h = harness().await;
    let addr = h.running.https_addr;
    // ALPN http/1.1, as the API server connects to service webhooks.
    let cfg = client_config(h.secret.ca.cert_pem(), &[b"http/1.1"]);
    let mut c = H1::open(addr, &cfg).await.unwrap();
    assert_eq!(c.leaf, der(&h.leaf_pem));
    let (status, body) = c
        .post(
            "/mutate?timeout=10s",
            serde_json::to_vec(&kubelet_create("u-1", "n1")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    check_create_answer(&body, "u-1").unwrap();
    // Same keep-alive connection: an update after reboot.
    let (status, body) = c
        .post(
            "/mutate",
            serde_json::to_vec(&node_controller_update_after_reboot("u-2", "n1")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["uid"], "u-2");
    assert_eq!(v["response"]["patchType"], "JSONPatch");

    // h2 via ALPN.
    let cfg2 = client_config(h.secret.ca.cert_pem(), &[b"h2", b"http/1.1"]);
    let (status, body, alpn) = post_h2(
        addr,
        &cfg2,
        serde_json::to_vec(&kubelet_create("u-3", "n2")).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(status, 200);
    check_create_answer(&body, "u-3").unwrap();

    // A client trusting another CA refuses the server.
    let other = Ca::generate(1).unwrap();
    let err = connect(addr, &client_config(other.cert_pem(), &[b"http/1.1"]))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );

    let (code, text) = get(h.running.admin_addr, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        text.contains(r#"nodegate_webhook_requests_total{operation="CREATE",result="patched"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"nodegate_webhook_taints_added_total{reason="create"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"nodegate_webhook_taints_added_total{reason="reboot"} 1"#),
        "{text}"
    );
    h.stop.send(()).unwrap();
    h.running.wait().await.unwrap();
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer_and_the_next_request_is_served() {
    let h = harness().await;
    let cfg = client_config(h.secret.ca.cert_pem(), &[b"http/1.1"]);
    let mut c = H1::open(h.running.https_addr, &cfg).await.unwrap();
    let good = serde_json::to_vec(&kubelet_create("u-ok", "n1")).unwrap();

    // Truncated JSON: no uid can be found → 400 with the parse error.
    let (status, body) = c
        .post("/mutate", good[..good.len() / 3].to_vec())
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("malformed AdmissionReview"));
    check_create_answer(&c.post("/mutate", good.clone()).await.unwrap().1, "u-ok").unwrap();

    // Wrong kind but a readable uid → allowed, untouched, uid echoed.
    let mut wrong = kubelet_create("u-wrong", "n1");
    wrong["kind"] = "Pod".into();
    let (status, body) = c
        .post("/mutate", serde_json::to_vec(&wrong).unwrap())
        .await
        .unwrap();
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["uid"], "u-wrong");
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none());

    // Missing request → 400.
    let (status, body) = c
        .post(
            "/mutate",
            br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#.to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("no request"));
    check_create_answer(&c.post("/mutate", good.clone()).await.unwrap().1, "u-ok").unwrap();

    // Over the 4 MiB limit → 413, then a fresh connection works.
    let mut c2 = H1::open(h.running.https_addr, &cfg).await.unwrap();
    let (status, _) = c2
        .post("/mutate", vec![b' '; 5 * 1024 * 1024])
        .await
        .unwrap();
    assert_eq!(status, 413);
    let mut c3 = H1::open(h.running.https_addr, &cfg).await.unwrap();
    check_create_answer(&c3.post("/mutate", good).await.unwrap().1, "u-ok").unwrap();

    let (_, text) = get(h.running.admin_addr, "/metrics").await.unwrap();
    assert!(
        text.contains(r#"nodegate_webhook_requests_total{operation="UNKNOWN",result="invalid"} 4"#),
        "{text}"
    );
    h.stop.send(()).unwrap();
    h.running.wait().await.unwrap();
}

async fn tls_reloads(admin: std::net::SocketAddr, result: &str) -> usize {
    let (_, text) = get(admin, "/metrics").await.unwrap();
    let prefix = format!("nodegate_webhook_tls_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// What the load clients share: the stop flag, the requests answered as
/// expected, the failures and every leaf certificate a handshake saw.
#[derive(Clone, Default)]
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<HashSet<Vec<u8>>>>,
}

impl Load {
    fn answered(&self) -> usize {
        self.ok.load(Ordering::Relaxed)
    }

    async fn answered_at_least(&self, n: usize) -> bool {
        self.answered() >= n
    }
}

/// One load client: a fresh connection every five requests (new handshakes
/// see rotations), every answer checked, until the load stops.
async fn load_client(w: usize, addr: SocketAddr, cfg: Arc<ClientConfig>, load: Load) {
    let mut n = 0;
    while !load.stop.load(Ordering::Relaxed) {
        let mut c = match H1::open(addr, &cfg).await {
            Ok(c) => c,
            Err(e) => {
                load.failures.lock().unwrap().push(format!("connect: {e}"));
                continue;
            }
        };
        load.seen.lock().unwrap().insert(c.leaf.clone());
        for _ in 0..5 {
            n += 1;
            let uid = format!("w{w}-{n}");
            let body = serde_json::to_vec(&kubelet_create(&uid, "n1")).unwrap();
            match c.post("/mutate", body).await {
                Ok((s, b)) if s == 200 => match check_create_answer(&b, &uid) {
                    Ok(()) => {
                        load.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => load.failures.lock().unwrap().push(e),
                },
                Ok((s, _)) => load.failures.lock().unwrap().push(format!("status {s}")),
                Err(e) => load.failures.lock().unwrap().push(format!("request: {e}")),
            }
        }
    }
}

/// A fresh handshake with the server presents `leaf`.
async fn served_by(addr: SocketAddr, cfg: &Arc<ClientConfig>, leaf: &[u8]) -> bool {
    connect(addr, cfg)
        .await
        .map(|(_, l)| l == leaf)
        .unwrap_or(false)
}

/// Two bad rotations under load, a certificate with a key that does not
/// belong to it and then no PEM at all: each is refused, and the old pair
/// (`first`) stays.
async fn bad_rotations_keep_the_old_pair(
    h: &mut Harness,
    cfg: &Arc<ClientConfig>,
    first: &[u8],
    load: &Load,
) {
    let (addr, admin) = (h.running.https_addr, h.running.admin_addr);
    // Bad rotation 1: a certificate with a key that does not belong to it.
    let other_a = h.secret.ca.issue(&serving_request()).unwrap();
    let other_b = h.secret.ca.issue(&serving_request()).unwrap();
    h.secret.install_raw(&other_a.cert_pem, &other_b.key_pem);
    eventually("mismatched pair refused", 10, || async {
        tls_reloads(admin, "failed").await >= 1
    })
    .await;
    assert!(
        served_by(addr, cfg, first).await,
        "old pair must stay after a bad rotation"
    );
    let before = load.answered();
    eventually("load continues", 20, || load.answered_at_least(before + 20)).await;

    // Bad rotation 2: not PEM at all.
    h.secret.install_raw("not a certificate", "not a key");
    eventually("garbage refused", 10, || async {
        tls_reloads(admin, "failed").await >= 2
    })
    .await;
    assert!(
        served_by(addr, cfg, first).await,
        "old pair must stay after a bad rotation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_under_load_drops_nothing() {
    let mut h = harness().await;
    let addr = h.running.https_addr;
    let admin = h.running.admin_addr;
    let cfg = client_config(h.secret.ca.cert_pem(), &[b"http/1.1"]);
    let first = der(&h.leaf_pem);

    // Load: several clients, each opening a fresh connection every few
    // requests (new handshakes see rotations), checking every answer.
    let load = Load::default();
    let clients: Vec<_> = (0..3)
        .map(|w| tokio::spawn(load_client(w, addr, cfg.clone(), load.clone())))
        .collect();
    eventually("initial load", 20, || load.answered_at_least(30)).await;

    bad_rotations_keep_the_old_pair(&mut h, &cfg, &first, &load).await;

    // Good rotation: a new leaf from the same CA.
    let next = h.secret.ca.issue(&serving_request()).unwrap();
    h.secret.install(&next);
    let next_der = der(&next.cert_pem);
    eventually("new certificate served", 10, || {
        served_by(addr, &cfg, &next_der)
    })
    .await;
    let before = load.answered();
    eventually("load on the new certificate", 20, || {
        load.answered_at_least(before + 30)
    })
    .await;

    load.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let failures = load.failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} failed requests: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let seen = load.seen.lock().unwrap().clone();
    assert!(
        seen.contains(&next_der),
        "load clients never saw the new certificate"
    );
    assert!(
        seen.iter().all(|l| *l == first || *l == next_der),
        "a bad certificate was served"
    );
    assert!(tls_reloads(admin, "ok").await >= 1);
    h.stop.send(()).unwrap();
    h.running.wait().await.unwrap();
}

#[tokio::test]
async fn shutdown_turns_unready_keeps_serving_for_the_delay_then_stops() {
    let h = harness_with(|c| c.shutdown_delay = Duration::from_secs(3)).await;
    let admin = h.running.admin_addr;
    let https = h.running.https_addr;
    assert_eq!(get(admin, "/readyz").await.unwrap().0, 200);
    assert_eq!(get(admin, "/livez").await.unwrap().0, 200);
    let cfg = client_config(h.secret.ca.cert_pem(), &[b"http/1.1"]);
    let mut idle = H1::open(https, &cfg).await.unwrap();
    h.stop.send(()).unwrap();
    eventually("readyz 503", 10, || async {
        get(admin, "/readyz").await.is_ok_and(|r| r.0 == 503)
    })
    .await;
    // Still serving new connections while endpoints catch up.
    let mut c = H1::open(https, &cfg).await.unwrap();
    let (status, body) = c
        .post(
            "/mutate",
            serde_json::to_vec(&kubelet_create("u-late", "n1")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    check_create_answer(&body, "u-late").unwrap();
    h.running.wait().await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(https).await.is_err(),
        "still accepting after shutdown"
    );
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "admin still accepting after shutdown"
    );
    // The idle keep-alive connection was closed by the drain.
    assert!(idle.post("/mutate", b"{}".to_vec()).await.is_err());
}

#[tokio::test]
async fn tls12_clients_are_served() {
    let h = harness().await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(der(h
            .secret
            .ca
            .cert_pem())))
        .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let (tls, _) = connect(h.running.https_addr, &Arc::new(cfg)).await.unwrap();
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    h.stop.send(()).unwrap();
    h.running.wait().await.unwrap();
}

#[tokio::test]
async fn stalled_request_headers_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = harness_with(|c| c.header_read_timeout = Duration::from_millis(300)).await;
    let cfg = client_config(h.secret.ca.cert_pem(), &[b"http/1.1"]);
    // Half a request head, and nothing at all after the handshake.
    for partial in [&b"POST /mutate HTTP/1.1\r\nHost: x\r\n"[..], &b""[..]] {
        let (mut tls, _) = connect(h.running.https_addr, &cfg).await.unwrap();
        tls.write_all(partial).await.unwrap();
        tls.flush().await.unwrap();
        let started = std::time::Instant::now();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buf)).await;
        assert!(
            read.is_ok(),
            "connection still open after the header read timeout"
        );
        // Closed by the timeout, not right away.
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "closed after {:?}",
            started.elapsed()
        );
    }
    h.stop.send(()).unwrap();
    h.running.wait().await.unwrap();
}

#[tokio::test]
async fn clients_without_alpn_are_served() {
    let h = harness().await;
    let cfg = client_config(h.secret.ca.cert_pem(), &[]);
    let mut c = H1::open(h.running.https_addr, &cfg).await.unwrap();
    let (status, body) = c
        .post(
            "/mutate",
            serde_json::to_vec(&kubelet_create("u-noalpn", "n1")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    check_create_answer(&body, "u-noalpn").unwrap();
    h.stop.send(()).unwrap();
    h.running.wait().await.unwrap();
}
