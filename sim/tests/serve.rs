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

/// Starts `nodegate-sim serve`; returns it and its stdout lines.
fn spawn_serve(
    kubeconfig: &std::path::Path,
) -> (std::process::Child, impl Iterator<Item = String>) {
    let mut sim = Command::new(env!("CARGO_BIN_EXE_nodegate-sim"))
        .args(["serve", "--kubeconfig-out"])
        .arg(kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(sim.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap);
    (sim, lines)
}

/// The webhook's admin address from serve's banner line
/// "nodegate-webhook:    https=ADDR admin=http://ADDR".
fn admin_addr(line: &str) -> Option<SocketAddr> {
    Some(line.split("admin=http://").nth(1)?.trim().parse().unwrap())
}

fn kill(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for serve to exit 0 and its webhook child to stop serving.
fn stopped_cleanly(sim: &mut std::process::Child, admin: SocketAddr, signal: &str) {
    let mut exit = None;
    wait_until("nodegate-sim to exit", Duration::from_secs(20), || {
        exit = sim.try_wait().unwrap();
        exit.is_some()
    });
    assert!(
        exit.unwrap().success(),
        "serve exits 0 on {signal}: {exit:?}"
    );
    wait_until(
        "the webhook child to stop serving",
        Duration::from_secs(10),
        || TcpStream::connect(admin).is_err(),
    );
}

fn stop_with(signal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (mut sim, lines) = spawn_serve(&kubeconfig);
    let mut admin: Option<SocketAddr> = None;
    for line in lines {
        admin = admin.or_else(|| admin_addr(&line));
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
    kill(signal, sim.id());
    stopped_cleanly(&mut sim, admin, signal);
}

#[test]
fn sigterm_stops_the_webhook_child() {
    stop_with("-TERM");
}

#[test]
fn ctrl_c_stops_the_webhook_child() {
    stop_with("-INT");
}

/// Whether `pid` has handlers for SIGINT and SIGTERM (`SigCgt` in
/// /proc/PID/status; bit n-1 for signal n).
fn catches_int_and_term(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .unwrap();
    let bit = |signal: u32| 1u64 << (signal - 1);
    mask & bit(2) != 0 && mask & bit(15) != 0
}

/// Serve takes Ctrl-C and SIGTERM before it prints anything, so a signal
/// that comes while the banner is being printed stops the webhook child
/// instead of killing serve by the default action and orphaning the child.
/// (Serve used to install them after the banner, and
/// `ctrl_c_stops_the_webhook_child` once lost that race in CI. This test
/// pins the order at the first banner line; it cannot replay the race.)
#[test]
fn signals_are_caught_before_the_banner() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (mut sim, mut lines) = spawn_serve(&kubeconfig);
    let first = lines.next().expect("serve prints a banner");
    assert!(first.starts_with("emulated API server"), "{first}");
    assert!(
        catches_int_and_term(sim.id()),
        "handlers are installed before the banner"
    );
    kill("-INT", sim.id());
    let admin = lines
        .find_map(|l| admin_addr(&l))
        .expect("serve prints the webhook's admin address");
    stopped_cleanly(&mut sim, admin, "-INT");
}
