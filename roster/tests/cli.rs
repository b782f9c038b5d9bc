//! The `nodegate-roster` binary's command line: bad settings are refused
//! before it touches a cluster, with a message that names the flag.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn roster(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nodegate-roster"))
        .args(args)
        .env_clear()
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run nodegate-roster")
}

#[test]
fn help_lists_every_flag_with_its_env() {
    let out = roster(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--namespace",
        "POD_NAMESPACE",
        "--identity",
        "--shards",
        "--interval",
        "--name",
        "--lease-duration",
        "--renew-deadline",
        "--retry-period",
        "--admin-listen",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

#[test]
fn unsafe_lease_timings_are_refused_before_any_request() {
    let out = roster(&["--lease-duration", "5s", "--renew-deadline", "10s"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--renew-deadline"), "{err}");
    assert!(
        !err.contains("credentials"),
        "validated before the client: {err}"
    );
}
