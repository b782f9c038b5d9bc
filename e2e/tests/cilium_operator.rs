//! The stand-in of cilium-operator's node-taint controller
//! (`nodegate_e2e::cilium_operator`) run in-process against the emulator,
//! as the `cilium-operator` ServiceAccount with exactly the access
//! `e2e/real-nodes/cilium/operator-rbac.yaml` grants (the emulator enforces
//! it), configured from a `cilium-config` ConfigMap read through the API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodegate_e2e::cilium_operator::decide::{Action, has_cilium_is_up_condition};
use nodegate_e2e::cilium_operator::{Controller, OperatorConfig, Options};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::{Value, json};

const OPERATOR: &str = "system:serviceaccount:kube-system:cilium-operator";
const NS: &str = "kube-system";
const KEY: &str = "node.cilium.io/agent-not-ready";
const DEADLINE: Duration = Duration::from_secs(10);
/// `cilium-config` as Cilium's chart renders it with its defaults.
const HELM_DEFAULTS: [(&str, &str); 3] = [
    ("remove-cilium-node-taints", "true"),
    ("set-cilium-node-taints", "true"),
    ("set-cilium-is-up-condition", "true"),
];

async fn emulator() -> Emulator {
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("real-nodes/cilium/operator-rbac.yaml");
    Emulator::start(EmulatorOptions {
        rbac: Some(vec![std::fs::read_to_string(rbac).unwrap()]),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Stores `cilium-config`, reads it back as the operator (as the binary
/// does at start) and starts the controller with it.
async fn operator(emu: &Emulator, data: &[(&str, &str)]) -> Controller {
    let admin = emu.client(users::ADMIN).await.unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cilium-config", "namespace": NS},
        "data": data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(admin, NS)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let client = emu.client(OPERATOR).await.unwrap();
    let cm = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get("cilium-config")
        .await
        .unwrap();
    let config = OperatorConfig::from_configmap_data(&cm.data.unwrap_or_default()).unwrap();
    let ns = config.resolve_pod_namespace(NS);
    Controller::start(client, Options::new(config, ns))
}

async fn create_node(emu: &Emulator, name: &str, taints: Value) {
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"taints": taints}}))
            .unwrap();
    let admin = emu.client(users::ADMIN).await.unwrap();
    Api::<Node>::all(admin)
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// A Cilium agent pod bound to `node`, not Ready yet.
async fn create_cilium_pod(emu: &Emulator, name: &str, node: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"k8s-app": "cilium"}},
        "spec": {"nodeName": node, "containers": [{"name": "cilium-agent", "image": "cilium"}]},
    }))
    .unwrap();
    let admin = emu.client(users::ADMIN).await.unwrap();
    Api::<Pod>::namespaced(admin, NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// The kubelet's status write: Running, Ready `ready`.
async fn set_ready(emu: &Emulator, pod: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let admin = emu.client(users::ADMIN).await.unwrap();
    Api::<Pod>::namespaced(admin, NS)
        .patch_status(
            pod,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
                {"type": "ContainersReady", "status": status},
                {"type": "Ready", "status": status},
            ]}})),
        )
        .await
        .unwrap();
}

async fn get_node(emu: &Emulator, name: &str) -> Node {
    let admin = emu.client(users::ADMIN).await.unwrap();
    Api::<Node>::all(admin).get(name).await.unwrap()
}

fn taints(n: &Node) -> Vec<Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn with_key(n: &Node, key: &str) -> Vec<Taint> {
    taints(n).into_iter().filter(|t| t.key == key).collect()
}

/// Polls the node until `f` holds; fails after [`DEADLINE`].
async fn wait_node(emu: &Emulator, name: &str, what: &str, f: impl Fn(&Node) -> bool) -> Node {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let n = get_node(emu, name).await;
        if f(&n) {
            return n;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "not within {DEADLINE:?}: {what}; node: {:?}",
            n.spec
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn written(c: &Controller, node: &str, action: Action) -> usize {
    c.writes()
        .iter()
        .filter(|w| w.node == node && w.action == action && w.error.is_none())
        .count()
}

#[tokio::test]
async fn ready_pod_removes_every_taint_with_the_key_and_keeps_the_others() {
    let emu = emulator().await;
    // As Cilium's chart renders cilium-config with its defaults.
    let op = operator(&emu, &HELM_DEFAULTS).await;
    create_node(
        &emu,
        "n-a",
        json!([
            {"key": KEY, "value": "true", "effect": "NoExecute"},
            {"key": "example.com/keep", "value": "v", "effect": "NoSchedule"},
            {"key": KEY, "effect": "NoSchedule"},
        ]),
    )
    .await;
    create_cilium_pod(&emu, "cilium-a", "n-a").await;
    // Scheduled, not Ready: the node already carries the key, nothing to do.
    set_ready(&emu, "cilium-a", true).await;

    let n = wait_node(&emu, "n-a", "every agent-not-ready taint removed", |n| {
        with_key(n, KEY).is_empty()
    })
    .await;
    let keys: Vec<String> = taints(&n).into_iter().map(|t| t.key).collect();
    assert_eq!(
        keys,
        ["example.com/keep", "node.kubernetes.io/not-ready"],
        "other taints kept, in order"
    );
    assert_eq!(
        with_key(&n, "example.com/keep")[0].value.as_deref(),
        Some("v")
    );
    wait_node(
        &emu,
        "n-a",
        "CiliumIsUp condition",
        has_cilium_is_up_condition,
    )
    .await;
    assert_eq!(written(&op, "n-a", Action::SetTaint), 0);
    assert!(written(&op, "n-a", Action::RemoveTaint) >= 1);
    let counts = op.counts();
    assert_eq!(counts.writes(), op.writes().len() as u64);
    op.stop().await;
}

#[tokio::test]
async fn scheduled_not_ready_pod_gets_the_taint_no_schedule() {
    let emu = emulator().await;
    let op = operator(&emu, &HELM_DEFAULTS).await;
    create_node(
        &emu,
        "n-b",
        json!([{"key": "example.com/keep", "value": "v", "effect": "NoExecute"}]),
    )
    .await;
    create_cilium_pod(&emu, "cilium-b", "n-b").await;
    set_ready(&emu, "cilium-b", false).await;

    let n = wait_node(&emu, "n-b", "agent-not-ready taint added", |n| {
        !with_key(n, KEY).is_empty()
    })
    .await;
    let added = with_key(&n, KEY);
    assert_eq!(added.len(), 1);
    assert_eq!(added[0].effect, "NoSchedule");
    assert!(
        added[0].value.as_deref().unwrap_or_default().is_empty(),
        "no value: {added:?}"
    );
    assert_eq!(with_key(&n, "example.com/keep").len(), 1, "others kept");
    assert!(!has_cilium_is_up_condition(&n));

    // The pod turns Ready: the taint goes again, the condition is set.
    set_ready(&emu, "cilium-b", true).await;
    wait_node(&emu, "n-b", "taint removed once Ready", |n| {
        with_key(n, KEY).is_empty() && has_cilium_is_up_condition(n)
    })
    .await;
    assert!(written(&op, "n-b", Action::SetTaint) >= 1);
    assert!(written(&op, "n-b", Action::RemoveTaint) >= 1);
    op.stop().await;
}

#[tokio::test]
async fn remove_off_removes_nothing() {
    let emu = emulator().await;
    // operator.removeNodeTaints=false (setNodeTaints follows it).
    let op = operator(
        &emu,
        &[
            ("remove-cilium-node-taints", "false"),
            ("set-cilium-node-taints", "false"),
            ("set-cilium-is-up-condition", "true"),
        ],
    )
    .await;
    create_node(
        &emu,
        "n-c",
        json!([{"key": KEY, "value": "true", "effect": "NoSchedule"}]),
    )
    .await;
    create_cilium_pod(&emu, "cilium-c", "n-c").await;
    set_ready(&emu, "cilium-c", true).await;

    // The controller did act on the node (markNode writes the condition
    // after the taint step, which is off), and the taint stays.
    let n = wait_node(
        &emu,
        "n-c",
        "CiliumIsUp condition",
        has_cilium_is_up_condition,
    )
    .await;
    assert_eq!(with_key(&n, KEY).len(), 1);
    assert_eq!(written(&op, "n-c", Action::RemoveTaint), 0);
    assert_eq!(op.counts().remove_ok + op.counts().remove_err, 0);
    op.stop().await;
}
