//! The harness the check's integration tests share: the real binary run as
//! an operator runs it ([`check`]) and its report lines ([`line`]), an
//! emulated cluster with nodegate installed ([`install`]), the
//! EndpointSlices of the webhook's replicas ([`endpoints`]), and the scoped
//! credential of `manifests/components/check-rbac` ([`rbac`]).
//!
//! Each test binary uses part of it, hence `dead_code` allowed.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod endpoints;
pub mod install;
pub mod rbac;

use std::path::Path;
use std::process::Command;

/// Runs the real binary with `kubeconfig` and `extra` flags, and nothing of
/// this process's environment but `PATH`; returns its exit code and stdout.
pub fn check(kubeconfig: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nodegate-check"))
        .args(extra)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "--- nodegate-check {extra:?} as {}\n{stdout}{}",
        kubeconfig.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

/// The report line of `check` with `status`; panics, showing the report,
/// without one.
pub fn line<'a>(out: &'a str, status: &str, check: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{status}  {check}")))
        .unwrap_or_else(|| panic!("no `{status}  {check}` line in:\n{out}"))
}

/// The report's failed lines.
pub fn failed(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("FAIL")).collect()
}
