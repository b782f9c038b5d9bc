//! The real `nodegate-webhook` binary: flags from the environment, the
//! `listening` line other tests parse, the admin endpoints, and a clean exit
//! on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use nodegate_certs::{Ca, write_files};
use nodegate_webhook::fixtures::kubelet_create;

/// Parses `listening https=ADDR admin=ADDR` out of a log line.
fn parse_listening(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let rest = &line[line.find("listening https=")? + "listening https=".len()..];
    let (https, rest) = rest.split_once(" admin=")?;
    let admin = rest.split_whitespace().next()?;
    Some((https.parse().ok()?, admin.parse().ok()?))
}

#[tokio::test]
async fn binary_serves_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate(1).unwrap();
    write_files(
        dir.path(),
        ca.cert_pem(),
        &ca.issue(&serving_request()).unwrap(),
    )
    .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_nodegate-webhook"))
        // Flags through their environment fallbacks.
        .env("NODEGATE_LISTEN", "127.0.0.1:0")
        .env("NODEGATE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("NODEGATE_TLS_CERT", dir.path().join("tls.crt"))
        .env("NODEGATE_TLS_KEY", dir.path().join("tls.key"))
        .env(
            "NODEGATE_TAINTS",
            "example.com/gate=x:NoSchedule,example.com/other:NoExecute",
        )
        // No cluster credentials anywhere.
        .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
        .env("HOME", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("NODEGATE_SHUTDOWN_DELAY", "0s")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (https, admin) = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no listening line; log so far: {log:#?}"));
        let parsed = parse_listening(&line);
        log.push(line);
        if let Some(addrs) = parsed {
            break addrs;
        }
    };
    assert!(https.ip().is_loopback() && https.port() != 0);
    assert!(
        log.iter()
            .any(|l| l.contains("reboot patches after status writes are disabled")),
        "{log:#?}"
    );

    assert_eq!(get(admin, "/livez").await.unwrap().0, 200);
    assert_eq!(get(admin, "/readyz").await.unwrap().0, 200);

    // The configured taints are the ones added.
    let cfg = client_config(ca.cert_pem(), &[b"http/1.1"]);
    let mut c = H1::open(https, &cfg).await.unwrap();
    let (status, body) = c
        .post(
            "/mutate",
            serde_json::to_vec(&kubelet_create("u-bin", "n1")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let warnings = v["response"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 2, "{v}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .contains("example.com/gate=x:NoSchedule")
    );

    let (code, text) = get(admin, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    for name in [
        r#"nodegate_webhook_requests_total{operation="CREATE",result="patched"} 1"#,
        "nodegate_webhook_request_duration_seconds_bucket",
        r#"nodegate_webhook_taints_added_total{reason="create"} 2"#,
        r#"nodegate_webhook_background_patches_total{result="skipped"} 0"#,
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status}");
    let rest: Vec<String> = rx.iter().collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:#?}");
}

#[test]
fn binary_refuses_bad_flags_with_a_clear_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-webhook"))
        .args(["--taint", "a:NoSchedule", "--taint", "a=b:NoSchedule"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listed twice"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-webhook"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--disable-reboot-patches",
        ])
        .arg("--tls-cert")
        .arg(dir.path().join("missing.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("missing.key"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("loading the serving certificate") && err.contains("missing.crt"),
        "{err}"
    );
}
