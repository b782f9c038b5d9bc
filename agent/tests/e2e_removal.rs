//! End-to-end, SIGTERM with `--daemonset`: while the agent's DaemonSet is
//! installed, a stop re-taints the node as always (a rollout, a drain, a
//! shutdown); once it is gone, nodegate is being removed and the agent
//! opens its node instead, gated or ready, so no node is left gated with
//! no agent to open it. A terminating Namespace is the other sign of a
//! removal; the emulator deletes at once and never shows one, so that row
//! is the table test's (`removal::tests`). The harness: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::DeleteParams;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;

use support::nodes::{cluster, node, our_taint, ready_boot_id};
use support::process::Agent;
use support::wait::eventually;

/// The install's namespace and DaemonSet, as the shipped manifests name them.
const NAMESPACE: &str = "nodegate";
const DAEMONSET: &str = "nodegate-agent";

/// Any taint of nodegate's, whatever its effect.
fn gated(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("nodegate.dev/")))
}

/// Deletes the agent's DaemonSet, as an uninstall does, and returns the
/// `--daemonset` the agent is to check with the reason it must give. A real
/// cluster keeps its installed DaemonSet: there the agent names one that
/// is not granted to it, so its read is refused as after an uninstall
/// deleted its Role.
async fn remove_daemonset(c: &Cluster) -> (String, &'static str) {
    if c.is_real() {
        return (c.name("removed-agent"), "daemonset_forbidden");
    }
    let admin = c.client(users::ADMIN).await.unwrap();
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin, NAMESPACE);
    daemonsets
        .delete(DAEMONSET, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the DaemonSet gone", || async {
        daemonsets.get_opt(DAEMONSET).await.unwrap().is_none()
    })
    .await;
    (DAEMONSET.to_string(), "daemonset_not_found")
}

/// The agent's flags: its probe file and the removal check of `daemonset`.
fn args<'a>(probe: &'a str, daemonset: &'a str) -> [&'a str; 8] {
    [
        "--probe-file",
        probe,
        "--probe-period",
        "200ms",
        "--daemonset",
        daemonset,
        "--pod-namespace",
        NAMESPACE,
    ]
}

/// A ready node: SIGTERM with the DaemonSet installed re-taints it (today's
/// behaviour: a rollout re-gates until the new agent is ready); the next
/// agent opens it again, and its SIGTERM after the DaemonSet was deleted
/// leaves it open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_retaints_a_removal_leaves_the_ready_node_open() {
    let (c, nodes) = cluster().await;
    let name = c.node_name("removal-ready");
    let kubelet = c.kubelet(&name).await.unwrap();
    assert!(our_taint(&kubelet.register().await.unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    let probe_arg = probe.to_str().unwrap().to_string();
    let state = dir.path().join("state");

    let mut agent = Agent::start(&c, &name, &state, &args(&probe_arg, DAEMONSET)).await;
    eventually("ready", || async {
        let n = node(&nodes, &name).await;
        !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    assert!(agent.term().await.success());
    assert!(
        our_taint(&node(&nodes, &name).await),
        "installed: SIGTERM re-taints"
    );
    assert!(agent.logged_with(&["not a removal; re-tainting", "installed"]));
    assert!(agent.logged("shutdown re-taint done"));

    let (daemonset, reason) = remove_daemonset(&c).await;
    let mut agent = Agent::start(&c, &name, &state, &args(&probe_arg, &daemonset)).await;
    eventually("ready again", || async {
        !our_taint(&node(&nodes, &name).await)
    })
    .await;
    // The ready patch's answer is handled before the agent takes SIGTERM.
    eventually("the removal counted", || async {
        agent.metric("nodegate_agent_taint_removals_total").await == Some(1.0)
    })
    .await;
    assert!(agent.term().await.success());
    assert!(agent.logged_with(&["nodegate is being removed", reason]));
    assert!(agent.logged("node opened on removal"));
    let n = node(&nodes, &name).await;
    assert!(!gated(&n), "removed: the ready node stays open");
    assert!(!agent.logged("shutdown re-taint done"));
}

/// A node still gated (its network agent never became ready): SIGTERM
/// after the DaemonSet was deleted removes the gate, records no ready
/// boot, and the agent exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_opens_a_gated_node() {
    let (c, nodes) = cluster().await;
    let name = c.node_name("removal-gated");
    let kubelet = c.kubelet(&name).await.unwrap();
    assert!(our_taint(&kubelet.register().await.unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("never");
    let probe_arg = probe.to_str().unwrap().to_string();

    let (daemonset, reason) = remove_daemonset(&c).await;
    let mut agent = Agent::start(
        &c,
        &name,
        &dir.path().join("state"),
        &args(&probe_arg, &daemonset),
    )
    .await;
    let failed = r#"nodegate_agent_probe_results_total{kind="file",index="0",result="fail"}"#;
    eventually("the gate on, its probe failing", || async {
        agent.metric(failed).await.unwrap_or(0.0) >= 1.0
            && agent.metric("nodegate_agent_ready").await == Some(0.0)
    })
    .await;
    assert!(our_taint(&node(&nodes, &name).await));

    let status = agent.term().await;
    assert!(status.success(), "clean exit: {status:?}");
    let n = node(&nodes, &name).await;
    assert!(!gated(&n), "removed: no nodegate taint left");
    assert_eq!(ready_boot_id(&n), None, "not recorded as ready");
    assert!(agent.logged_with(&["nodegate is being removed", reason]));
    assert!(agent.logged("node opened on removal"));
}
