//! `nodegate-sim serve` as a user runs it: the real binary, stopped by a
//! signal, must not leave its webhook child running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `cond` every 50 ms until it holds or `deadline` passes.
fn wait_until(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop_with(signal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut sim = Command::new(env!("CARGO_BIN_EXE_nodegate-sim"))
        .args(["serve", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // "nodegate-webhook:    https=ADDR admin=http://ADDR"
    let mut admin: Option<SocketAddr> = None;
    for line in BufReader::new(sim.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.split("admin=http://").nth(1) {
            admin = Some(rest.trim().parse().unwrap());
        }
        if line.starts_with("Ctrl-C stops") {
            break;
        }
    }
    let admin = admin.expect("serve prints the webhook's admin address");
    assert!(kubeconfig.exists(), "serve writes the kubeconfig");
    assert!(
        TcpStream::connect(admin).is_ok(),
        "webhook admin port answers"
    );

    let status = Command::new("kill")
        .args([signal, &sim.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut exit = None;
    wait_until("nodegate-sim to exit", Duration::from_secs(20), || {
        exit = sim.try_wait().unwrap();
        exit.is_some()
    });
    assert!(exit.unwrap().success(), "serve exits 0 on {signal}");
    wait_until(
        "the webhook child to stop serving",
        Duration::from_secs(10),
        || TcpStream::connect(admin).is_err(),
    );
}

#[test]
fn sigterm_stops_the_webhook_child() {
    stop_with("-TERM");
}

#[test]
fn ctrl_c_stops_the_webhook_child() {
    stop_with("-INT");
}
