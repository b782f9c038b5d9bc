//! End-to-end, taint keys the agent shares a node with or moves away from:
//! beside Cilium's operator, an upgrade from Cilium's key, a switch of key
//! profile. The harness and real-cluster mode: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use nodegate_emulator::users;
use nodegate_shared::keys::DEFAULT_TAINT;
use serde_json::json;

use support::nodes::{cluster, has_taint, node, our_taint, ready_boot_id, record_versions};
use support::process::Agent;
use support::wait::eventually;

/// Beside cilium-operator's node-taint controller with Cilium's Helm
/// defaults (its stand-in, `nodegate_e2e::cilium_operator`): each owns its
/// own taint key, neither removes the other's, and once the node settled
/// neither writes it again (the loop of a shared key is gone). Emulator
/// only: a real cluster runs its own Cilium, or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_cilium_operator_each_owns_its_key_and_nothing_loops() {
    use k8s_openapi::api::core::v1::Pod;
    use nodegate_e2e::cilium_operator::decide::{Action, has_cilium_is_up_condition};
    use nodegate_e2e::cilium_operator::{Controller, OperatorConfig, Options};
    const CILIUM_KEY: &str = "node.cilium.io/agent-not-ready";
    let (c, nodes) = cluster().await;
    if c.is_real() {
        println!(
            "skipped on a real cluster: e2e/real-nodes runs the operator's stand-in beside Cilium's DaemonSet"
        );
        return;
    }
    let admin = c.client(users::ADMIN).await.unwrap();
    let node_a = c.node_name("cilium-a");
    let kubelet = c.kubelet(&node_a).await.unwrap();
    assert!(our_taint(&kubelet.register().await.unwrap()));
    // Cilium's agent pod on the node, scheduled, not Ready.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cilium-a", "namespace": "kube-system", "labels": {"k8s-app": "cilium"}},
        "spec": {"nodeName": node_a, "containers": [{"name": "cilium-agent", "image": "cilium"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let mut opts = Options::new(OperatorConfig::helm_defaults(), "kube-system");
    opts.print = false;
    let operator = Controller::start(admin.clone(), opts);
    eventually(
        "the operator's own taint while Cilium is not Ready",
        || async { has_taint(&node(&nodes, &node_a).await, CILIUM_KEY) },
    )
    .await;

    // Cilium's node-local signs of life: nodegate's agent ungates its key only.
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("05-cilium.conflist");
    std::fs::write(&probe, b"{}").unwrap();
    let mut agent = Agent::start(
        &c,
        &node_a,
        &dir.path().join("state"),
        &["--probe-file", probe.to_str().unwrap()],
    )
    .await;
    eventually("nodegate's gate removed", || async {
        !our_taint(&node(&nodes, &node_a).await)
    })
    .await;
    assert!(
        has_taint(&node(&nodes, &node_a).await, CILIUM_KEY),
        "the agent removed the operator's taint"
    );

    // The kubelet reports the Cilium pod Ready: the operator ungates its key.
    pods.patch_status(
        "cilium-a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
            {"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();
    // Settled: both taints gone, the operator's condition set, and its
    // removal recorded (the record follows the API server's answer).
    let removed = || {
        operator
            .writes()
            .iter()
            .any(|w| w.action == Action::RemoveTaint && w.error.is_none())
    };
    eventually(
        "the operator's taint removed and its condition set",
        || async {
            let n = node(&nodes, &node_a).await;
            !has_taint(&n, CILIUM_KEY)
                && !our_taint(&n)
                && has_cilium_is_up_condition(&n)
                && removed()
        },
    )
    .await;
    // A quiet window, measured: a loop between the two would write taints
    // within it. (The operator may write its condition a second time from
    // a stale cache, on its own; that is no loop.)
    let taint_writes = || {
        operator
            .writes()
            .iter()
            .filter(|w| w.action != Action::SetCondition && w.error.is_none())
            .count()
    };
    let before = taint_writes();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        taint_writes(),
        before,
        "the operator kept writing taints: {:?}",
        operator.writes()
    );
    assert_eq!(
        before,
        2,
        "its taint and its removal: {:?}",
        operator.writes()
    );
    assert_eq!(
        agent.metric("nodegate_agent_taint_removals_total").await,
        Some(1.0),
        "the agent removed a taint more than once"
    );
    assert!(
        operator.writes().iter().all(|w| w.node == node_a),
        "{:?}",
        operator.writes()
    );
    operator.stop().await;
    assert!(agent.term().await.success());
}

/// An upgrade from a nodegate that used Cilium's key: a node the old
/// webhook gated carries `node.cilium.io/agent-not-ready=true:NoSchedule`;
/// the new agent's ready patch removes it with its own (exactly, under the
/// confinement), and no taint of either is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_ciliums_key_leaves_no_stale_taint() {
    use nodegate_shared::keys::LEGACY_TAINT;
    let (c, nodes) = cluster().await;
    // The release is opt-in (components/release-cilium-key) and so is its
    // confinement: a real cluster runs the default install.
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: needs components/release-cilium-key installed");
        return;
    };
    emu.apply(include_str!(
        "../../manifests/components/release-cilium-key/confinement.yaml"
    ))
    .unwrap();
    let node_a = c.node_name("upgrade-a");
    let kubelet = c.kubelet(&node_a).await.unwrap();
    kubelet.register().await.unwrap();
    let legacy =
        json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
    nodes
        .patch(
            &node_a,
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "add", "path": "/spec/taints/-", "value": legacy}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("05-cilium.conflist");
    std::fs::write(&probe, b"{}").unwrap();
    let release = format!("--release-taint={LEGACY_TAINT}");
    let mut agent = Agent::start(
        &c,
        &node_a,
        &dir.path().join("state"),
        &["--probe-file", probe.to_str().unwrap(), &release],
    )
    .await;
    eventually("both taints gone in the ready patch", || async {
        let n = node(&nodes, &node_a).await;
        !our_taint(&n) && !has_taint(&n, "node.cilium.io/agent-not-ready")
    })
    .await;
    // Counted once the API server has answered, which can be after the
    // node is read without the taints.
    eventually("the one ready patch counted", || async {
        agent.metric("nodegate_agent_taint_removals_total").await == Some(1.0)
    })
    .await;
    assert!(agent.term().await.success());
}

/// The karpenter profile's gate, and its key: the profile the switch tests
/// move to.
const NEW: &str = nodegate_shared::keys::KARPENTER_PROFILE_TAINT;
const NEW_KEY: &str = "readiness.k8s.io/nodegate-agent-not-ready";

/// A file of the karpenter profile's component, as shipped.
fn karpenter_profile(file: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/components/key-profiles/karpenter");
    std::fs::read_to_string(dir.join(file)).unwrap()
}

/// A probe file that passes, in `dir`, as the agent's `--probe-file` value.
fn passing_probe(dir: &Path) -> String {
    let probe = dir.join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    probe.to_str().unwrap().to_string()
}

/// Moving to another key profile (here `key-profiles/karpenter`) leaves no
/// node ungated and no stale taint: a node gated under the default key before
/// the switch keeps a gate until its agent, now managing the profile's key and
/// releasing the default one, is ready, and then carries neither; a node
/// created after the switch gets only the profile's key. Every version of the
/// old node before its ready patch carries a gate. Emulator only: it rewrites
/// the install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_key_profiles_leaves_no_node_ungated_and_no_stale_taint() {
    let (c, nodes) = cluster().await;
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: the test rewrites the install");
        return;
    };
    let old = c.node_name("gated-before");
    let kubelet_old = c.kubelet(&old).await.unwrap();
    assert!(our_taint(&kubelet_old.register().await.unwrap()));

    // Every version of the old node, from here on.
    let (seen, watch) = record_versions(&nodes, &old);

    // The profile's webhook, lines and confinement replace the default ones.
    let webhook = nodegate_e2e::WebhookProcess::start(nodegate_e2e::WebhookOptions {
        taints: vec![NEW.into()],
        kubeconfig: Some(emu.webhook_kubeconfig().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    webhook
        .attach(emu, Some(&karpenter_profile("webhook-config.yaml")))
        .unwrap();
    emu.apply(&karpenter_profile("confinement.yaml")).unwrap();

    let new = c.node_name("created-after");
    let kubelet_new = c.kubelet(&new).await.unwrap();
    let created = kubelet_new.register().await.unwrap();
    assert!(has_taint(&created, NEW_KEY), "the profile's gate at create");
    assert!(!our_taint(&created), "no default gate after the switch");

    let dir = tempfile::tempdir().unwrap();
    let probe = passing_probe(dir.path());
    let flags = [
        "--taint",
        NEW,
        "--release-taint",
        DEFAULT_TAINT,
        "--release-taint",
        "node.cilium.io/agent-not-ready=true:NoSchedule",
        "--probe-file",
        &probe,
    ];
    let mut agents = Vec::new();
    for (name, kubelet) in [(&old, &kubelet_old), (&new, &kubelet_new)] {
        agents.push(Agent::start(&c, name, &dir.path().join(name), &flags).await);
        eventually(&format!("{name} ready, with neither key"), || async {
            let n = node(&nodes, name).await;
            !our_taint(&n)
                && !has_taint(&n, NEW_KEY)
                && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
        })
        .await;
    }
    watch.abort();
    let versions = seen.lock().unwrap().clone();
    assert!(!versions.is_empty());
    for n in versions.iter().filter(|n| ready_boot_id(n).is_none()) {
        assert!(
            our_taint(n) || has_taint(n, NEW_KEY),
            "a version of {old} before its ready patch without a gate: {:?}",
            n.spec.as_ref().and_then(|s| s.taints.clone())
        );
    }
    for mut a in agents {
        a.term().await;
    }
    for name in [&old, &new] {
        let n = node(&nodes, name).await;
        assert!(
            !our_taint(&n),
            "{name}: the released default taint came back"
        );
    }
}

/// While a switch of key profile rolls out, the new confinement is in force
/// but old agents still run: an agent of the old configuration removes its
/// gate when ready and puts it back at shutdown (its key stands in for the
/// new one), and the new agent on that node later releases it. A stolen
/// agent token gains nothing by the stand-ins: it still cannot add a key
/// nodegate does not ship, nor a shipped boot gate (NoExecute evicts).
/// Emulator only: it rewrites the install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_agent_re_gates_with_its_key_under_the_new_confinement() {
    let (c, nodes) = cluster().await;
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: the test rewrites the install");
        return;
    };
    let name = c.node_name("rolling");
    let kubelet = c.kubelet(&name).await.unwrap();
    assert!(our_taint(&kubelet.register().await.unwrap()));
    emu.apply(&karpenter_profile("confinement.yaml")).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let probe = passing_probe(dir.path());
    let mut old = Agent::start(
        &c,
        &name,
        &dir.path().join("old"),
        &["--probe-file", &probe],
    )
    .await;
    eventually(
        "the old agent's ready patch passes the new confinement",
        || async {
            let n = node(&nodes, &name).await;
            !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
        },
    )
    .await;
    assert!(old.term().await.success());
    assert!(
        our_taint(&node(&nodes, &name).await),
        "the old agent's shutdown re-gate (its own key) was refused"
    );

    // A thief with this node's agent token: only shipped NoSchedule gates.
    let thief: Api<Node> = Api::all(c.agent_client(&name).await.unwrap());
    for (taint, allowed) in [
        (
            "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready",
            "NoSchedule",
        ),
        ("example.com/not-shipped", "NoSchedule"),
        ("readiness.k8s.io/nodegate-agent-not-ready", "NoExecute"),
    ]
    .map(|(k, e)| {
        (
            json!({"key": k, "value": "true", "effect": e}),
            e == "NoSchedule" && k.starts_with("startup-taint"),
        )
    }) {
        let n = node(&nodes, &name).await;
        let mut taints =
            serde_json::to_value(n.spec.and_then(|s| s.taints).unwrap_or_default()).unwrap();
        taints.as_array_mut().unwrap().push(taint.clone());
        let patch = json!({"spec": {"taints": taints}});
        let r = thief
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        match (allowed, r) {
            (true, Ok(_)) => {}
            (false, Err(kube::Error::Api(e))) => assert_eq!(e.code, 403, "{taint}: {}", e.message),
            (want, got) => panic!("{taint}: allowed {want}, got {got:?}"),
        }
    }

    let mut new = Agent::start(
        &c,
        &name,
        &dir.path().join("new"),
        &["--taint", NEW, "--probe-file", &probe],
    )
    .await;
    eventually("the new agent releases both stale keys", || async {
        let n = node(&nodes, &name).await;
        !our_taint(&n)
            && !has_taint(&n, NEW_KEY)
            && !has_taint(
                &n,
                "startup-taint.cluster-autoscaler.kubernetes.io/nodegate-agent-not-ready",
            )
    })
    .await;
    assert!(new.term().await.success());
    let n = node(&nodes, &name).await;
    assert!(
        has_taint(&n, NEW_KEY) && !our_taint(&n),
        "the new agent re-gates with the new key only"
    );
}
