//! Strict mode: the agent's token, stolen, cannot evict its node's
//! workloads with the boot gate, nor move the ready record to fake a boot.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::{DEFAULT_TAINT, READY_BOOT_ID_ANNOTATION};
use serde_json::{Value, json};

use crate::support::node_writes::{json_patch, patch, ready_boot_id_path};
use crate::support::refusals::{AGENT_POLICY, WEBHOOK_POLICY, assert_refused};
use crate::support::taints::{TAINT_KEY, taints};
use crate::support::target_node::node;

const GATE_MSG: &str = "may add the boot gate nodegate.dev/agent-not-ready:NoExecute";
const RECORD_MSG: &str = "only to the node's current bootID, and not remove it";

/// Strict mode's boot gate.
fn boot_gate() -> Value {
    json!({"key": TAINT_KEY, "value": "true", "effect": "NoExecute"})
}

/// The kubelet's status write of boot `id`.
fn boot(id: &str) -> Value {
    json!({"status": {"nodeInfo": {"bootID": id}}})
}

/// The strict-mode confinement installed, and a node named from `base` on
/// boot `b1`, recorded by its agent as ready; `None` on a real cluster (it
/// runs one install, and the real-nodes suite attacks the strict-mode one).
async fn ready_on_b1(c: &Cluster, base: &str) -> Option<(String, Api<Node>)> {
    let Some(emu) = c.emulator() else {
        println!("skipped on a real cluster: e2e/real-nodes attacks the strict-mode install");
        return None;
    };
    emu.apply(&nodegate_webhook::confinement::render(
        &[DEFAULT_TAINT.parse().unwrap()],
        &["nodegate.dev/agent-not-ready=true:NoExecute"
            .parse()
            .unwrap()],
        &[],
    ))
    .unwrap();
    let a = node(c, base).await;
    let admin = c.client(users::ADMIN).await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch_status(&a, &PatchParams::default(), &Patch::Merge(boot("b1")))
        .await
        .unwrap();
    patch(
        &admin,
        &a,
        json!({"metadata": {"annotations": {READY_BOOT_ID_ANNOTATION: "b1"}}}),
    )
    .await
    .unwrap();
    Some((a, nodes))
}

/// Strict mode's boot gate evicts every workload that does not tolerate it,
/// so a stolen agent token must not be able to put it on its node while the
/// node runs the boot it recorded as ready, nor move the record to make it
/// look rebooted. On a real boot change the agent's safety net needs it.
/// Emulator only: a real cluster runs one install, and the real-nodes suite
/// attacks the strict-mode install there.
#[tokio::test]
async fn in_strict_mode_a_stolen_agent_token_cannot_evict_its_nodes_workloads() {
    let c = Cluster::start().await.unwrap();
    let Some((a, nodes)) = ready_on_b1(&c, "strict-a").await else {
        return;
    };
    let agent = c.agent_client(&a).await.unwrap();
    the_ready_boot_can_be_neither_gated_nor_moved(&c, &agent, &a).await;
    a_new_boot_is_gated_then_released(&c, &nodes, &agent, &a).await;
}

/// On boot `b1`, recorded as ready: no gate, and the record stays.
async fn the_ready_boot_can_be_neither_gated_nor_moved(c: &Cluster, agent: &kube::Client, a: &str) {
    let add_gate = json!([{"op": "add", "path": "/spec/taints/-", "value": boot_gate()}]);
    assert_refused(
        "gate on the boot recorded as ready",
        json_patch(agent, a, add_gate).await,
        &[AGENT_POLICY, GATE_MSG, a],
    );
    let ann = ready_boot_id_path();
    assert_refused(
        "record removed",
        json_patch(agent, a, json!([{"op": "remove", "path": ann}])).await,
        &[AGENT_POLICY, RECORD_MSG],
    );
    assert_refused(
        "record moved to another boot",
        json_patch(
            agent,
            a,
            json!([{"op": "replace", "path": ann, "value": "b0"}]),
        )
        .await,
        &[AGENT_POLICY, RECORD_MSG],
    );
    // Both in one write: the rule reads the stored record.
    assert_refused(
        "record moved and gate added at once",
        json_patch(
            agent,
            a,
            json!([{"op": "replace", "path": ann, "value": "b0"},
                   {"op": "add", "path": "/spec/taints/-", "value": boot_gate()}]),
        )
        .await,
        &[AGENT_POLICY],
    );
    assert_eq!(
        taints(c, a).await,
        [
            "nodegate.dev/agent-not-ready:NoSchedule",
            "example.com/dedicated:NoSchedule"
        ]
    );
}

/// The node reboots: the safety net's write goes through, and so does the
/// ready patch of the new boot, which removes both; the record cannot go
/// back to the old boot.
async fn a_new_boot_is_gated_then_released(
    c: &Cluster,
    nodes: &Api<Node>,
    agent: &kube::Client,
    a: &str,
) {
    nodes
        .patch_status(a, &PatchParams::default(), &Patch::Merge(boot("b2")))
        .await
        .unwrap();
    let add_gate = json!([{"op": "add", "path": "/spec/taints/-", "value": boot_gate()}]);
    json_patch(agent, a, add_gate).await.unwrap();
    assert!(
        taints(c, a)
            .await
            .contains(&"nodegate.dev/agent-not-ready:NoExecute".to_string())
    );
    let gated = nodes.get(a).await.unwrap();
    let ours: Vec<usize> = gated
        .spec
        .unwrap()
        .taints
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, t)| t.key == TAINT_KEY)
        .map(|(i, _)| i)
        .rev()
        .collect();
    let ann = ready_boot_id_path();
    let mut ready: Vec<Value> = ours
        .iter()
        .map(|i| json!({"op": "remove", "path": format!("/spec/taints/{i}")}))
        .collect();
    ready.push(json!({"op": "replace", "path": ann, "value": "b2"}));
    json_patch(agent, a, json!(ready)).await.unwrap();
    assert_eq!(taints(c, a).await, ["example.com/dedicated:NoSchedule"]);
    assert_refused(
        "record moved back to the old boot",
        json_patch(
            agent,
            a,
            json!([{"op": "replace", "path": ann, "value": "b1"}]),
        )
        .await,
        &[AGENT_POLICY, RECORD_MSG],
    );
}

/// The webhook's token, stolen, in strict mode: it adds the boot gate only
/// once the stored node runs another boot than the one its agent recorded
/// as ready (the webhook never adds it on a re-registration's claim), so it
/// cannot evict a node's pods on the boot they run on. Emulator only, as the
/// agent's test above.
#[tokio::test]
async fn in_strict_mode_a_stolen_webhook_token_cannot_evict_a_ready_boot() {
    let c = Cluster::start().await.unwrap();
    let Some((a, nodes)) = ready_on_b1(&c, "strict-w").await else {
        return;
    };
    let webhook = c.webhook_client().await.unwrap();
    let add_gate = json!([{"op": "add", "path": "/spec/taints/-", "value": boot_gate()}]);
    assert_refused(
        "the webhook gates the ready boot",
        json_patch(&webhook, &a, add_gate.clone()).await,
        &[
            WEBHOOK_POLICY,
            GATE_MSG,
            "only on a boot other than the one its agent recorded as ready",
        ],
    );
    // The stored node runs a new boot: the gate is the webhook's to add.
    nodes
        .patch_status(&a, &PatchParams::default(), &Patch::Merge(boot("b2")))
        .await
        .unwrap();
    json_patch(&webhook, &a, add_gate).await.unwrap();
    assert!(
        taints(&c, &a)
            .await
            .contains(&format!("{TAINT_KEY}:NoExecute"))
    );
}
