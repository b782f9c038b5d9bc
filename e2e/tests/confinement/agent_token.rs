//! The agent's ServiceAccount token, stolen: its pod-bound token of node A
//! may remove A's gate and record the boot, nothing else anywhere; without a
//! pod claim (unbound, or bound to the Node) it may do nothing; it may
//! release the old default taint only where that is opted in, and never
//! add it.

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::{EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use serde_json::{Value, json};

use crate::support::credentials::{bound_token_request, impersonating, token_client};
use crate::support::node_writes::{json_patch, patch, ready_boot_id_path};
use crate::support::refusals::{AGENT_POLICY, assert_refused};
use crate::support::taints::{TAINT_KEY, taints};
use crate::support::target_node::node;

#[tokio::test]
async fn a_stolen_agent_token_touches_nothing_but_its_own_nodes_gate() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-a").await;
    let b = node(&c, "conf-b").await;
    let admin = c.client(users::ADMIN).await.unwrap();
    patch(&admin, &a, json!({"spec": {"unschedulable": true}}))
        .await
        .unwrap();
    let agent_a = c.agent_client(&a).await.unwrap();
    let on_a = format!("nodegate-agent of node '{a}'");

    // Another node: any change at all.
    assert_refused(
        "agent of A removes B's taint",
        json_patch(
            &agent_a,
            &b,
            json!([{"op": "remove", "path": "/spec/taints/0"}]),
        )
        .await,
        &[AGENT_POLICY, &on_a, &format!("may not write node '{b}'")],
    );
    nothing_but_the_gate_on_its_own_node(&c, &agent_a, &a, &on_a).await;

    // Without a node claim (a token not bound to a pod on a node): nothing.
    let unbound = c.client(users::AGENT).await.unwrap();
    assert_refused(
        "unbound token removes the gate",
        json_patch(
            &unbound,
            &a,
            json!([{"op": "remove", "path": "/spec/taints/0"}]),
        )
        .await,
        &["token without a node claim"],
    );

    the_agents_own_writes_go_through(&c, &agent_a, &a).await;
    // Everyone else is never evaluated: the admin still labels and uncordons.
    patch(
        &admin,
        &a,
        json!({"metadata": {"labels": {"x": "y"}}, "spec": {"unschedulable": null}}),
    )
    .await
    .unwrap();
}

/// On its own node `a` the agent's token changes nothing but the gate.
async fn nothing_but_the_gate_on_its_own_node(
    c: &Cluster,
    agent_a: &kube::Client,
    a: &str,
    on_a: &str,
) {
    let refused: Vec<(&str, Value, String)> = vec![
        (
            "label its node (steer workloads)",
            json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            "metadata.labels".into(),
        ),
        (
            "switch the gate off",
            json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}}),
            "metadata.labels".into(),
        ),
        (
            "uncordon mid-drain",
            json!({"spec": {"unschedulable": null}}),
            "spec.unschedulable".into(),
        ),
        (
            "set a providerID",
            json!({"spec": {"providerID": "evil://x"}}),
            "spec.providerID".into(),
        ),
        (
            "another annotation",
            json!({"metadata": {"annotations": {"example.com/x": "y"}}}),
            "metadata.annotations['example.com/x']".into(),
        ),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
            "metadata.finalizers".into(),
        ),
        (
            "an owner",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "x", "uid": "00000000-0000-0000-0000-000000000001"}]}}),
            "metadata.ownerReferences".into(),
        ),
    ];
    for (what, body, field) in refused {
        assert_refused(
            what,
            patch(agent_a, a, body).await,
            &[AGENT_POLICY, on_a, &field, &format!("node '{a}'")],
        );
    }
    assert_refused(
        "remove a foreign taint on its node",
        json_patch(
            agent_a,
            a,
            json!([
                {"op": "test", "path": "/spec/taints/1/key", "value": "example.com/dedicated"},
                {"op": "remove", "path": "/spec/taints/1"},
            ]),
        )
        .await,
        &[
            AGENT_POLICY,
            on_a,
            "may change only the taints",
            "example.com/dedicated",
        ],
    );
    assert_eq!(
        taints(c, a).await,
        [
            format!("{TAINT_KEY}:NoSchedule"),
            "example.com/dedicated:NoSchedule".to_string()
        ],
        "nothing changed"
    );
}

/// What the agent does on its node `a`: remove its taint and record the
/// boot, add it back.
async fn the_agents_own_writes_go_through(c: &Cluster, agent_a: &kube::Client, a: &str) {
    // One annotation key, never the whole map: replacing it would drop the
    // annotations controllers add (the policy rightly refuses that).
    let key = ready_boot_id_path();
    let ready = json_patch(
        agent_a,
        a,
        json!([
            {"op": "test", "path": "/spec/taints/0/key", "value": TAINT_KEY},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "add", "path": key, "value": "boot-1"},
        ]),
    )
    .await
    .unwrap();
    assert_eq!(
        ready.metadata.annotations.unwrap()[READY_BOOT_ID_ANNOTATION],
        "boot-1"
    );
    assert_eq!(taints(c, a).await, ["example.com/dedicated:NoSchedule"]);
    json_patch(
        agent_a,
        a,
        json!([{"op": "add", "path": "/spec/taints/-",
                "value": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}}]),
    )
    .await
    .unwrap();
    assert_eq!(
        taints(c, a).await,
        [
            "example.com/dedicated:NoSchedule".to_string(),
            format!("{TAINT_KEY}:NoSchedule")
        ]
    );
}

/// Upgrades: with `components/release-cilium-key` (opt-in) the agent may
/// remove the taint nodegate added by default before it had a key of its
/// own, exactly as it was added (`--release-taint`), and nothing else under
/// that key: Cilium's operator keeps its own taint there with an empty value.
/// It may never add the old taint. Without the component (the default
/// install) it may not even remove it: the same taint can be an admin's or an
/// autoscaler's own gate. The opted-in half runs on the emulator, where the
/// test may replace the installed policy.
#[tokio::test]
async fn a_stolen_agent_token_releases_only_the_old_default_taint() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-release").await;
    the_default_install_releases_nothing(&c, &a).await;
    let Some(emu) = c.emulator() else { return };
    emu.apply(include_str!(
        "../../../manifests/components/release-cilium-key/confinement.yaml"
    ))
    .unwrap();
    let admin = c.client(users::ADMIN).await.unwrap();
    let agent_a = c.agent_client(&a).await.unwrap();
    let operators = json!({"key": "node.cilium.io/agent-not-ready", "effect": "NoSchedule"});
    let legacy =
        json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
    let add = |t: &Value| json!([{"op": "add", "path": "/spec/taints/-", "value": t}]);
    let nodes: Api<Node> = Api::all(admin.clone());
    // The guarded removal of `t` at its index in the stored list.
    let remove = async |t: &Value| {
        let stored = serde_json::to_value(nodes.get(&a).await.unwrap()).unwrap();
        let i = stored["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .position(|x| x == t)
            .unwrap();
        json!([{"op": "test", "path": format!("/spec/taints/{i}"), "value": t},
               {"op": "remove", "path": format!("/spec/taints/{i}")}])
    };

    json_patch(&admin, &a, add(&operators)).await.unwrap();
    assert_refused(
        "agent removes the operator's taint",
        json_patch(&agent_a, &a, remove(&operators).await).await,
        &[
            AGENT_POLICY,
            "may change only the taints",
            "node.cilium.io/agent-not-ready:NoSchedule",
        ],
    );
    json_patch(&admin, &a, remove(&operators).await)
        .await
        .unwrap();
    assert_refused(
        "agent adds the old default taint",
        json_patch(&agent_a, &a, add(&legacy)).await,
        &[AGENT_POLICY, "may change only the taints"],
    );
    json_patch(&admin, &a, add(&legacy)).await.unwrap();
    // The release is removal only: not a swap for the operator's taint, not
    // a cover for another change.
    let mut swap = remove(&legacy).await;
    swap.as_array_mut()
        .unwrap()
        .push(json!({"op": "add", "path": "/spec/taints/-", "value": operators}));
    assert_refused(
        "agent swaps the old taint for the operator's",
        json_patch(&agent_a, &a, swap).await,
        &[AGENT_POLICY, "may change only the taints"],
    );
    let mut cover = remove(&legacy).await;
    cover
        .as_array_mut()
        .unwrap()
        .push(json!({"op": "add", "path": "/spec/taints/-",
        "value": {"key": "example.com/evil", "effect": "NoSchedule"}}));
    assert_refused(
        "agent adds a foreign taint while releasing",
        json_patch(&agent_a, &a, cover).await,
        &[AGENT_POLICY, "example.com/evil:NoSchedule"],
    );
    json_patch(&agent_a, &a, remove(&legacy).await)
        .await
        .expect("the agent releases the old default taint");
    assert_eq!(
        taints(&c, &a).await,
        [
            format!("{TAINT_KEY}:NoSchedule"),
            "example.com/dedicated:NoSchedule".to_string()
        ]
    );
}

/// The default install (no `components/release-cilium-key`): the agent may
/// not remove the old default taint either.
async fn the_default_install_releases_nothing(c: &Cluster, a: &str) {
    let admin = c.client(users::ADMIN).await.unwrap();
    let agent_a = c.agent_client(a).await.unwrap();
    let legacy =
        json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
    json_patch(
        &admin,
        a,
        json!([{"op": "add", "path": "/spec/taints/-", "value": legacy}]),
    )
    .await
    .unwrap();
    let stored =
        serde_json::to_value(Api::<Node>::all(admin.clone()).get(a).await.unwrap()).unwrap();
    let i = stored["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .position(|x| *x == legacy)
        .unwrap();
    assert_refused(
        "agent of the default install removes Cilium's key",
        json_patch(
            &agent_a,
            a,
            json!([{"op": "test", "path": format!("/spec/taints/{i}"), "value": legacy},
            {"op": "remove", "path": format!("/spec/taints/{i}")}]),
        )
        .await,
        &[AGENT_POLICY, "may change only the taints"],
    );
    json_patch(
        &admin,
        a,
        json!([{"op": "remove", "path": format!("/spec/taints/{i}")}]),
    )
    .await
    .unwrap();
}

/// The agent ServiceAccount's token bound to Node `node` itself
/// (TokenRequest with `boundObjectRef` kind Node): the node claims, no pod.
/// Where the API server issues none (the emulator, a cluster without
/// `ServiceAccountTokenNodeBinding`: 400), the same identity impersonated.
async fn node_bound_agent(c: &Cluster, node: &str) -> (kube::Client, &'static str) {
    let admin = c.client(users::ADMIN).await.unwrap();
    let uid = Api::<Node>::all(admin.clone())
        .get(node)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let request = bound_token_request("Node", Some(node.into()), Some(uid.clone()));
    let sas: Api<ServiceAccount> = Api::namespaced(admin, "nodegate");
    match sas
        .create_token_request("nodegate-agent", &PostParams::default(), &request)
        .await
    {
        Ok(r) => {
            let kubeconfig = c.kubeconfig(users::ADMIN).unwrap();
            let client = token_client(&kubeconfig, r.status.unwrap().token).await;
            (client, "TokenRequest")
        }
        Err(kube::Error::Api(e)) if e.code == 400 => {
            println!("no Node-bound token here ({}): impersonated", e.message);
            let client = impersonating(
                c,
                users::AGENT,
                &[
                    (users::NODE_NAME_EXTRA, node),
                    (users::NODE_UID_EXTRA, &uid),
                ],
            )
            .await;
            (client, "impersonated")
        }
        Err(e) => panic!("TokenRequest for node {node}: {e}"),
    }
}

/// A token bound to the Node, not to a pod on it, carries the node's name
/// but no pod: whoever can mint one (anyone with `create
/// serviceaccounts/token` on the agent's account) must not get the agent's
/// power over that node.
#[tokio::test]
async fn a_node_bound_agent_token_changes_nothing() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-node-bound").await;
    let (thief, how) = node_bound_agent(&c, &a).await;
    assert_refused(
        &format!("node-bound token ({how}) removes its node's gate"),
        json_patch(
            &thief,
            &a,
            json!([
                {"op": "test", "path": "/spec/taints/0/key", "value": TAINT_KEY},
                {"op": "remove", "path": "/spec/taints/0"},
            ]),
        )
        .await,
        &[
            AGENT_POLICY,
            &format!("nodegate-agent (token of node '{a}' without a pod claim)"),
            "authentication.kubernetes.io/pod-name",
        ],
    );
    // The pod claim without its uid is no pod claim either.
    let half = impersonating(
        &c,
        users::AGENT,
        &[
            (users::NODE_NAME_EXTRA, &a),
            (users::POD_NAME_EXTRA, "nodegate-agent-x"),
        ],
    )
    .await;
    assert_refused(
        "pod name without pod uid",
        patch(&half, &a, json!({"metadata": {"labels": {"x": "y"}}})).await,
        &[AGENT_POLICY, "without a pod claim"],
    );
    assert_eq!(
        taints(&c, &a).await,
        [
            format!("{TAINT_KEY}:NoSchedule"),
            "example.com/dedicated:NoSchedule".to_string()
        ],
        "nothing changed"
    );
}
