//! The real `nodegate-check` against the cluster, and its line for Cluster
//! Autoscaler: the verdict the duplicate count is held against.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

/// The check's name in nodegate-check's report.
pub const CHECK: &str = "cluster autoscaler";

/// Runs `nodegate-check` as the admin and returns the status of its
/// `cluster autoscaler` line (`PASS`, `FAIL`, `WARN`, `SKIP`), `absent`
/// when the report has no such line, with the whole report (kept in `out`).
pub async fn run(kubeconfig: &Path, out: &Path) -> anyhow::Result<(String, String)> {
    let bin = crate::process::bin_path("nodegate-check");
    let child = tokio::process::Command::new(&bin)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(180), child)
        .await
        .context("nodegate-check took over 180 s")?
        .with_context(|| format!("running {}", bin.display()))?;
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    std::fs::write(
        out,
        format!("{report}{}", String::from_utf8_lossy(&output.stderr)),
    )?;
    let (status, detail) = line(&report).unwrap_or(("absent", ""));
    Ok((status.to_string(), detail.to_string()))
}

/// `STATUS  <check padded to 22> <detail>`, the report's line format.
fn line(report: &str) -> Option<(&str, &str)> {
    report.lines().find_map(|l| {
        let (status, rest) = l.split_once("  ")?;
        if !matches!(status, "PASS" | "FAIL" | "WARN" | "SKIP") {
            return None;
        }
        let rest = rest.strip_prefix(CHECK)?;
        rest.starts_with(' ').then(|| (status, rest.trim()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_line() {
        let r = "PASS  canary                 ok\nFAIL  cluster autoscaler     no --startup-taint\nresult: FAIL\n";
        assert_eq!(line(r), Some(("FAIL", "no --startup-taint")));
        assert_eq!(line("PASS  canary                 ok\n"), None);
        assert_eq!(line("PASS  cluster autoscalers   x\n"), None);
    }
}
