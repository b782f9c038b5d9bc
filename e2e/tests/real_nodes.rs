//! nodegate as users run it: the README's install, verbatim, on real nodes
//! (real kubelets, containerd, the bridge CNI; `e2e/real-nodes/cluster`),
//! then the scenarios a platform engineer relies on, each asserted from
//! watches of Nodes and Pods. The harness is a library,
//! `nodegate_e2e::real_nodes`; each scenario group is a file in
//! `real_nodes/`.
//!
//! Needs the harness's cluster: `e2e/real-nodes/run` brings it up and runs
//! this with `NODEGATE_REAL_NODES` set to its state directory. CI cannot build
//! the Kubernetes binaries, so the test is ignored there (`--ignored` runs it).
//!
//! Order matters: every step starts from the state the previous one left.
//! Figures are printed as `FIGURE <name> <value>` lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use nodegate_e2e::readme::repo_dir;
use nodegate_e2e::real_nodes::admission::Prober;
use nodegate_e2e::real_nodes::harness::Harness;
use nodegate_e2e::real_nodes::live::node_names;
use nodegate_e2e::real_nodes::record;
use nodegate_e2e::real_nodes::scenario::Ctx;

#[path = "real_nodes/cilium.rs"]
mod cilium;
#[path = "real_nodes/cilium_operator.rs"]
mod cilium_operator;
#[path = "real_nodes/forged.rs"]
mod forged;
#[path = "real_nodes/gates.rs"]
mod gates;
#[path = "real_nodes/helm.rs"]
mod helm;
#[path = "real_nodes/install.rs"]
mod install;
#[path = "real_nodes/join.rs"]
mod join;
#[path = "real_nodes/outage.rs"]
mod outage;
#[path = "real_nodes/pruning.rs"]
mod pruning;
#[path = "real_nodes/reboot.rs"]
mod reboot;
#[path = "real_nodes/rollouts.rs"]
mod rollouts;
#[path = "real_nodes/strict.rs"]
mod strict;
#[path = "real_nodes/strict_workloads.rs"]
mod strict_workloads;
#[path = "real_nodes/token.rs"]
mod token;

/// Runs in CI: without the Kubernetes binaries the harness refuses in one
/// line naming what is missing, exits non-zero, and makes nothing.
#[test]
fn without_kubernetes_binaries_the_harness_says_so_in_one_line() {
    let empty = tempfile::tempdir().unwrap();
    // A PATH with nothing on it but the shell the script runs in.
    let bin = empty.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink("/bin/bash", bin.join("bash")).unwrap();
    let out = Command::new(repo_dir().join("e2e/real-nodes/cluster"))
        .arg("check")
        .env("KUBE_BIN_DIR", empty.path())
        .env("PATH", &bin)
        .env("NODEGATE_REAL_NODES_DIR", empty.path().join("state"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no kube-apiserver kube-controller-manager kube-scheduler kubelet"),
        "{err}"
    );
    assert!(!empty.path().join("state").exists(), "check made state");
    // The one command parses (it runs nothing in CI).
    let parsed = Command::new("bash")
        .arg("-n")
        .arg(repo_dir().join("e2e/real-nodes/run"))
        .status()
        .unwrap();
    assert!(parsed.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs real nodes: e2e/real-nodes/run"]
async fn nodegate_on_real_nodes() {
    let h = Harness::from_env();
    let client = h.client().await;
    let rec = record::start(h.config().await);
    let nodes0 = node_names(&client).await;
    assert!(
        nodes0.len() >= 2,
        "the harness brings up at least two nodes"
    );
    // One group alone (`strict`, `gates`, `cilium`, `lines`, `forged`, `helm`), on a cluster
    // an earlier run left up with nodegate installed
    // (NODEGATE_REAL_NODES_KEEP=1): a shorter loop while working on it.
    let only = std::env::var("NODEGATE_REAL_NODES_ONLY").ok();
    if only.is_none() {
        install::install(&h, &client, &nodes0).await;
        token::token_in_logs(&h, "install");
    }
    let c = Ctx {
        prober: Prober::start(client.clone()),
        h,
        client,
        rec,
        nodes0,
    };
    match only.as_deref() {
        Some("strict") => return strict::strict_mode(&c).await,
        Some("gates") => return gates::gates(&c).await,
        Some("cilium") => return cilium::cilium(&c).await,
        Some("lines") => {
            outage::webhook_host_crash(&c).await;
            outage::webhook_host_down(&c).await;
            return rollouts::rollouts(&c).await;
        }
        Some("forged") => return forged::forged_reviews(&c, &c.nodes0[1], "default").await,
        Some("helm") => return helm::helm(&c).await,
        Some("helm-upgrade") => return helm::upgrades(&c).await,
        Some("helm-profile") => return helm::profile(&c).await,
        Some(other) => {
            panic!(
                "NODEGATE_REAL_NODES_ONLY={other}: strict, gates, cilium, lines, forged, helm, helm-upgrade or helm-profile"
            )
        }
        None => {}
    }
    join::join(&c).await;
    forged::forged_reviews(&c, "node3", "default").await;
    reboot::crash_reboot(&c).await;
    reboot::kubelet_restart(&c).await;
    outage::webhook_drained(&c).await;
    token::token_in_logs(&c.h, "webhooks_drained");
    rollouts::rollouts(&c).await;
    token::token_in_logs(&c.h, "rollouts");
    token::rotation(&c, "default").await;
    rollouts::upgrade(&c).await;
    pruning::pruning(&c).await;
    outage::webhook_host_crash(&c).await;
    outage::webhook_host_down(&c).await;
    token::token_in_logs(&c.h, "replica_outage");
    pruning::memory_and_nothing_gated(&c).await;
    strict::strict_mode(&c).await;
    cilium::cilium(&c).await;
    helm::helm(&c).await;
    // Last: the newest group, from the install the Helm group leaves
    // (kustomize, pruning), back to it at its end.
    gates::gates(&c).await;
}
