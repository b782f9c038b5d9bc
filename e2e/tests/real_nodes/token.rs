//! The path token on real nodes: where it lands after an install, a rollout
//! and a replica outage (the API server's log, the audit log, the kubelets'
//! logs, the pods' logs), and a rotation by `nodegate-certs
//! rotate-path-token` while a worker crash-reboots, each reboot gated from
//! the first version of its new boot.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use nodegate_e2e::real_nodes::admission::Window;
use nodegate_e2e::real_nodes::harness::{Harness, figure, ok, step};
use nodegate_e2e::real_nodes::live::{node_names, replica_hosts};
use nodegate_e2e::real_nodes::scenario::{Ctx, crash_to_new_boot, ready_and_ungated};

/// Every token seen so far: a rotation replaces the Secret's.
static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Every token the install has used: the Secret's now, the README's
/// `ng-certs/path-token`, and those seen before (rotations replaced them).
fn tokens(h: &Harness) -> Vec<String> {
    let secret = ok(
        "the path token Secret",
        h.sh("kubectl -n nodegate get secret nodegate-webhook-path -o jsonpath='{.data.token}' | base64 -d"),
    );
    let mut all: Vec<String> = secret.lines().map(str::trim).map(str::to_owned).collect();
    if let Ok(first) = std::fs::read_to_string(h.work.path().join("ng-certs/path-token")) {
        all.push(first.trim().to_owned());
    }
    all.retain(|t| !t.is_empty());
    assert!(!all.is_empty(), "no path token in the cluster");
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    seen.extend(all);
    seen.iter().cloned().collect()
}

/// Lines of the files under `path` (a file or a directory, walked) holding
/// any of `tokens`.
fn lines_with(path: &Path, tokens: &[String]) -> u64 {
    let mut n = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        } else if let Ok(bytes) = std::fs::read(&p) {
            let text = String::from_utf8_lossy(&bytes);
            n += text
                .lines()
                .filter(|l| tokens.iter().any(|t| l.contains(t.as_str())))
                .count() as u64;
        }
    }
    n
}

/// The API server log's lines holding a token at the previous count.
static APISERVER_LINES: AtomicU64 = AtomicU64::new(0);

/// Counts the lines holding the token in each place a less trusted reader
/// looks, as figures `token_lines_<when>_<place>`. nodegate keeps it out of
/// the audit log (its check never sends it), the kubelets' logs and every
/// pod's log; the API server's log it cannot keep it out of (a failed call
/// is logged with its URL), so that count is a figure only, with the lines
/// added since the previous count (`…_apiserver_log_new`).
pub(crate) fn token_in_logs(h: &Harness, when: &str) {
    step(&format!("the path token in the logs after the {when}"));
    let tokens = tokens(h);
    let log = h.state.join("log");
    let apiserver = lines_with(&log.join("kube-apiserver.log"), &tokens);
    let audit = lines_with(&log.join("audit.log"), &tokens);
    let nodes: u64 = std::fs::read_dir(&log)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let name = p.file_name().unwrap_or_default().to_string_lossy();
                    name.starts_with("node") && name.ends_with(".log")
                })
                .map(|p| lines_with(&p, &tokens))
                .sum()
        })
        .unwrap_or(0);
    let pods = lines_with(Path::new("/var/log/pods"), &tokens);
    figure(&format!("token_lines_{when}_apiserver_log"), apiserver);
    let before = APISERVER_LINES.swap(apiserver, Ordering::AcqRel);
    figure(
        &format!("token_lines_{when}_apiserver_log_new"),
        apiserver.saturating_sub(before),
    );
    figure(&format!("token_lines_{when}_audit_log"), audit);
    figure(&format!("token_lines_{when}_node_logs"), nodes);
    figure(&format!("token_lines_{when}_pod_logs"), pods);
    assert_eq!(
        (audit, nodes, pods),
        (0, 0, 0),
        "the token in the audit log, a node's (kubelet, containerd) or a pod's log"
    );
}

/// `nodegate-certs rotate-path-token` while a worker crash-reboots: each
/// reboot during and after it is gated from the first version of its new
/// boot (the re-registration re-taint, which needs an accepted token), and
/// no call fails open.
pub(crate) async fn rotation(c: &Ctx, mode: &str) {
    let Ctx {
        h, client, prober, ..
    } = c;
    step(&format!(
        "path token rotation (nodegate-certs rotate-path-token) while a worker crash-reboots ({mode})"
    ));
    let hosts: Vec<String> = replica_hosts(client)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let worker = node_names(client)
        .await
        .into_iter()
        .find(|n| !hosts.contains(n))
        .expect("a node that runs no webhook replica");
    // Remember the token being replaced, for the log counts after.
    let replaced = tokens(h);
    let window = Window::open(h, prober);
    let t0 = Instant::now();
    let kubeconfig = h.kubeconfig.clone();
    let rotating = std::thread::spawn(move || {
        std::process::Command::new(nodegate_e2e::process::bin_path("nodegate-certs"))
            .arg("rotate-path-token")
            .env("KUBECONFIG", kubeconfig)
            .output()
            .expect("run nodegate-certs rotate-path-token")
    });
    let mut during = 0;
    while !rotating.is_finished() {
        let crash = crash_to_new_boot(c, &worker, &[]).await;
        crash.assert_gated("a crash reboot during the token rotation");
        ready_and_ungated(
            c,
            &worker,
            &format!("{mode}_rotation_worker_ready_to_untaint_ms"),
        )
        .await;
        during += 1;
    }
    let out = rotating.join().expect("the rotation thread");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{said}");
    assert!(out.status.success(), "rotate-path-token failed:\n{said}");
    figure(
        &format!("{mode}_token_rotation_ms"),
        t0.elapsed().as_millis(),
    );
    figure(
        &format!("{mode}_token_rotation_crash_reboots_during"),
        during,
    );
    let tokens = tokens(h);
    assert!(
        tokens.len() > replaced.len(),
        "the rotation made a new token"
    );
    assert!(
        !tokens.iter().any(|t| said.contains(t.as_str())),
        "the rotation printed a token"
    );
    // After it: the new token alone moves the webhook.
    let crash = crash_to_new_boot(c, &worker, &[]).await;
    crash.assert_gated("a crash reboot after the token rotation");
    ready_and_ungated(
        c,
        &worker,
        &format!("{mode}_rotation_after_ready_to_untaint_ms"),
    )
    .await;
    window.close_none_open(h, prober, &format!("{mode}_token_rotation"));
    let check = h.sh("nodegate-check");
    assert!(
        check.status.success(),
        "nodegate-check after the token rotation:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
}
