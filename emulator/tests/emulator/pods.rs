//! Pods: the scheduler's binding, the kubelet's sync and its pod admission
//! at start (TaintToleration), and the taint-eviction controller.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::taint_eviction_controller::TaintEvictionController;
use nodegate_emulator::users;
use serde_json::json;

use crate::support::{emulator, poll};

#[tokio::test]
async fn pods_binding_status_and_field_selector() {
    let emu = emulator().await;
    let pods: Api<Pod> = Api::namespaced(emu.client(users::ADMIN).await.unwrap(), "default");
    let p: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap();
    let p = pods.create(&PostParams::default(), &p).await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    let r = emu
        .raw(Some(users::SCHEDULER), "POST", "/api/v1/namespaces/default/pods/p1/binding", "application/json",
             serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "n1"}})).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status, 201);
    let r2 = emu
        .raw(
            Some(users::SCHEDULER),
            "POST",
            "/api/v1/namespaces/default/pods/p1/binding",
            "application/json",
            serde_json::to_vec(&json!({"target": {"name": "n2"}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r2.status, 409);
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(on_n1.items.len(), 1);
    let kubelet = SimKubelet::new(&emu, "n1").await.unwrap();
    assert_eq!(kubelet.sync_pods().await.unwrap(), 1);
    assert_eq!(
        pods.get("p1")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
}

/// A NoExecute taint on a node, as nodegate's strict mode adds at a new
/// boot: the kubelet refuses the bound pods that do not tolerate it when it
/// starts, and the taint-eviction controller deletes them; a pod tolerating
/// it stays. NoSchedule taints stop neither.
#[tokio::test]
async fn a_no_execute_taint_gets_untolerating_pods_refused_at_kubelet_start_and_evicted() {
    const GATE: &str = "nodegate.dev/agent-not-ready";
    let emu = emulator().await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut kubelet = SimKubelet::new(&emu, "n1").await.unwrap();
    kubelet.register().await.unwrap();
    let tolerating = |effect: &str| json!([{"key": GATE, "operator": "Exists", "effect": effect}]);
    for (name, node, tolerations) in [
        ("plain", "n1", json!([])),
        ("schedule-only", "n1", tolerating("NoSchedule")),
        ("tolerating", "n1", tolerating("NoExecute")),
        ("elsewhere", "n2", json!([])),
    ] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "tolerations": tolerations,
                     "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    // First boot: only TaintNodesByCondition's NoSchedule taint, every pod starts.
    let first = kubelet.admit_pods().await.unwrap();
    assert_eq!(first.started.len(), 3, "{first:?}");
    assert!(first.rejected.is_empty());

    let mut taints = nodes.get("n1").await.unwrap().spec.unwrap().taints.unwrap();
    taints.push(
        serde_json::from_value(json!({"key": GATE, "value": "true", "effect": "NoExecute"}))
            .unwrap(),
    );
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap();
    kubelet.reboot().await.unwrap();
    let second = kubelet.admit_pods().await.unwrap();
    let rejected: Vec<&str> = second.rejected.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(rejected, ["default/plain", "default/schedule-only"]);
    assert_eq!(second.kept, ["default/tolerating"]);
    let status = pods.get("plain").await.unwrap().status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("TaintToleration"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
        )
    );

    let controller = TaintEvictionController::start(admin.clone());
    let left = poll(
        "the untolerating pods evicted",
        Duration::from_secs(10),
        || async {
            let names: Vec<String> = pods
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            (names.len() == 2).then_some(names)
        },
    )
    .await;
    assert_eq!(left, ["elsewhere", "tolerating"]);
    let evicted: Vec<(String, String)> = controller
        .evictions()
        .into_iter()
        .map(|e| (e.pod.name, e.node))
        .collect();
    assert_eq!(
        evicted,
        [
            ("plain".to_string(), "n1".to_string()),
            ("schedule-only".into(), "n1".into())
        ]
    );
    controller.stop().await;
}
