//! End-to-end, several gates in one install: the webhook adds every gate,
//! one agent opens each on its own probes, one write per gate at most and
//! one for gates ready together, and a reboot or a stop closes them all.
//! Emulator only: it rewrites the install (a real cluster runs the default
//! gate; e2e/real-nodes runs two gates under real kubelets).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use nodegate_shared::keys::DEFAULT_TAINT;

use support::nodes::{
    cluster, has_taint, node, node_events, our_taint, ready_boot_id, record_versions,
};
use support::process::Agent;
use support::wait::eventually;

const CSI: &str = "nodegate.dev/csi-not-ready=true:NoSchedule";
const CSI_KEY: &str = "nodegate.dev/csi-not-ready";

/// `nodegate-webhook <what> --taint=<default> --taint=<csi>`.
fn render(what: &str) -> String {
    let bin = nodegate_e2e::process::bin_path("nodegate-webhook");
    let out = Command::new(&bin)
        .args([
            what,
            &format!("--taint={DEFAULT_TAINT}"),
            &format!("--taint={CSI}"),
        ])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (cargo build -p nodegate-webhook)", bin.display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The webhook for both gates, its lines and the confinement, in place of
/// the default install's.
async fn two_gate_webhook(emu: &nodegate_emulator::Emulator) -> nodegate_e2e::WebhookProcess {
    let webhook = nodegate_e2e::WebhookProcess::start(nodegate_e2e::WebhookOptions {
        taints: vec![DEFAULT_TAINT.into(), CSI.into()],
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    webhook
        .attach(emu, Some(&render("webhook-config")))
        .unwrap();
    emu.apply(&render("confinement")).unwrap();
    webhook
}

/// The agent's declaration: `cni` opened by one file, `csi` by another.
fn gates(cni: &Path, csi: &Path) -> String {
    serde_json::json!({"gates": [
        {"name": "cni", "taint": DEFAULT_TAINT, "probes": {"file": [cni]}},
        {"name": "csi", "taint": CSI, "probes": {"file": [csi]}},
    ]})
    .to_string()
}

fn keys(n: &Node) -> (bool, bool, bool) {
    (
        our_taint(n),
        has_taint(n, CSI_KEY),
        ready_boot_id(n).is_some(),
    )
}

/// The distinct (default gate, csi gate, ready-boot-id) states in order.
fn story(versions: &[Node]) -> Vec<(bool, bool, bool)> {
    let mut out: Vec<(bool, bool, bool)> = Vec::new();
    for n in versions {
        let k = keys(n);
        if out.last() != Some(&k) {
            out.push(k);
        }
    }
    out
}

/// Waits until the watch has delivered a version in state `last`.
async fn seen_up_to(seen: &Arc<Mutex<Vec<Node>>>, last: (bool, bool, bool)) {
    eventually("the watch delivered the last version", || async {
        story(&seen.lock().unwrap()).last() == Some(&last)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gate_opens_on_its_own_probes_and_all_come_back_at_reboot_and_stop() {
    let (c, nodes) = cluster().await;
    let Some(emu) = c.emulator() else {
        println!("skipped on a real cluster: the test rewrites the install");
        return;
    };
    let webhook = two_gate_webhook(emu).await;

    // One gate after the other: two writes, the bootID with the last.
    let name = c.node_name("two-gates");
    let mut kubelet = c.kubelet(&name).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert!(
        our_taint(&created) && has_taint(&created, CSI_KEY),
        "both gates at create"
    );
    let (seen, watch) = record_versions(&nodes, &name);
    let dir = tempfile::tempdir().unwrap();
    let (cni, csi) = (dir.path().join("cni"), dir.path().join("csi"));
    std::fs::write(&cni, b"ok").unwrap();
    let flags = ["--gates".to_string(), gates(&cni, &csi)];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut agent = Agent::start(&c, &name, &dir.path().join("state"), &flags).await;
    eventually("the cni gate open, the csi gate still on", || async {
        let n = node(&nodes, &name).await;
        !our_taint(&n) && has_taint(&n, CSI_KEY)
    })
    .await;
    assert_eq!(
        ready_boot_id(&node(&nodes, &name).await),
        None,
        "not ready yet"
    );
    std::fs::write(&csi, b"ok").unwrap();
    eventually("both gates open, the boot recorded", || async {
        let n = node(&nodes, &name).await;
        !our_taint(&n) && !has_taint(&n, CSI_KEY) && ready_boot_id(&n).is_some()
    })
    .await;
    assert_eq!(
        story(&seen.lock().unwrap()),
        [
            (true, true, false),
            (false, true, false),
            (false, false, true)
        ],
        "one write per gate, no version without a gate before the last"
    );
    let events = node_events(&c, &name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("NodegateGateOpen")
                && e.message.as_deref().is_some_and(|m| m.contains("gate cni"))),
        "the cni gate's Event"
    );
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("NodegateReady"))
    );
    assert!(agent.metric("nodegate_agent_gate_open{gate=\"csi\"}").await == Some(1.0));

    // A reboot: the webhook adds both back, the agent opens both (ready
    // together now: one write).
    seen.lock().unwrap().clear();
    kubelet.reboot().await.unwrap();
    eventually("the new boot recorded ready", || async {
        ready_boot_id(&node(&nodes, &name).await).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    seen_up_to(&seen, (false, false, true)).await;
    let after: Vec<(bool, bool)> = story(&seen.lock().unwrap())
        .into_iter()
        .map(|(a, b, _)| (a, b))
        .collect();
    assert!(
        after.contains(&(true, true)),
        "both gates back at reboot: {after:?}"
    );
    assert!(
        !after.contains(&(false, true)) && !after.contains(&(true, false)),
        "gates ready together open together: {after:?}"
    );

    // A reboot whose csi agent is late: the cni gate opens alone before
    // the boot is recorded, and stays open (the webhook's update-after-
    // reboot rule leaves the node's own agent's write alone), then csi.
    std::fs::remove_file(&csi).unwrap();
    seen.lock().unwrap().clear();
    kubelet.reboot().await.unwrap();
    eventually("the cni gate open alone on the new boot", || async {
        let n = node(&nodes, &name).await;
        !our_taint(&n) && has_taint(&n, CSI_KEY)
    })
    .await;
    std::fs::write(&csi, b"ok").unwrap();
    eventually("the new boot recorded ready", || async {
        ready_boot_id(&node(&nodes, &name).await).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    seen_up_to(&seen, (false, false, true)).await;
    let versions = seen.lock().unwrap().len();
    assert!(
        versions <= 12,
        "{versions} versions for one reboot: a gate opened alone was fought over"
    );

    // A stop re-gates both.
    agent.term().await;
    let n = node(&nodes, &name).await;
    assert!(
        our_taint(&n) && has_taint(&n, CSI_KEY),
        "both gates back at shutdown"
    );
    watch.abort();
    drop(webhook);
}

/// A gate opened by a Pod-Ready probe whose Pod is Ready before the agent
/// starts opens with the others in the agent's first write: the probe waits
/// for its watch's first list instead of failing the first round (which
/// cost every agent start a write per gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_pod_gate_opens_with_the_others_in_one_write() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams, PostParams};
    const NS: &str = "kube-system";
    let (c, nodes) = cluster().await;
    let Some(emu) = c.emulator() else {
        println!("skipped on a real cluster: the test rewrites the install");
        return;
    };
    let webhook = two_gate_webhook(emu).await;
    let name = c.node_name("pod-gate");
    let kubelet = c.kubelet(&name).await.unwrap();
    kubelet.register().await.unwrap();
    let app = c.name("csi");
    let pods: kube::Api<Pod> =
        kube::Api::namespaced(c.client(nodegate_emulator::users::ADMIN).await.unwrap(), NS);
    let pod_name = c.name("csi-node");
    c.delete_on_drop("pods", NS, &pod_name);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pod_name, "namespace": NS, "labels": {"app": app}},
        "spec": {"nodeName": name, "containers": [{"name": "c", "image": "csi"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ready = serde_json::json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(ready))
        .await
        .unwrap();
    let (seen, watch) = record_versions(&nodes, &name);
    let dir = tempfile::tempdir().unwrap();
    let cni = dir.path().join("cni");
    std::fs::write(&cni, b"ok").unwrap();
    let gates = serde_json::json!({"gates": [
        {"name": "cni", "taint": DEFAULT_TAINT, "probes": {"file": [cni]}},
        {"name": "csi", "taint": CSI, "probes": {"pod": [format!("{NS}/app={app}")]}},
    ]})
    .to_string();
    let mut agent = Agent::start(&c, &name, &dir.path().join("state"), &["--gates", &gates]).await;
    eventually("both gates open, the boot recorded", || async {
        let n = node(&nodes, &name).await;
        !our_taint(&n) && !has_taint(&n, CSI_KEY) && ready_boot_id(&n).is_some()
    })
    .await;
    seen_up_to(&seen, (false, false, true)).await;
    assert_eq!(
        story(&seen.lock().unwrap()),
        [(true, true, false), (false, false, true)],
        "one write for gates ready together"
    );
    watch.abort();
    agent.term().await;
    drop(webhook);
}
