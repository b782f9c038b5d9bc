//! nodegate's own credentials, attacked as a thief would use them: the
//! agent's pod-bound token of node A, the same ServiceAccount's token without
//! a node claim, and the webhook's token, against the shipped install (RBAC
//! plus the confinement ValidatingAdmissionPolicies). Every forbidden change
//! must be refused (403, naming the node and the field) and every change the
//! workloads need must go through. Runs against a fresh emulator, or a real
//! cluster when NODEGATE_E2E_KUBECONFIG is set (see e2e/README.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use serde_json::{Value, json};

const TAINT_KEY: &str = "nodegate.dev/agent-not-ready";
const AGENT_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-agent-confinement' with binding 'nodegate-agent-confinement'";

/// A node as an admin sees it after a kubelet registered it, with a foreign
/// taint and a cordon, so the attacks have something to remove. It has an
/// annotation from the start, as every real node has (the TTL controller's,
/// added at an unknown moment), so adding one key never replaces the map.
async fn node(c: &Cluster, base: &str) -> String {
    let name = c.node_name(base);
    let admin: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                     "annotations": {"example.com/owner": "nodegate-e2e"}},
        "spec": {"taints": [
            {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"},
            {"key": "example.com/dedicated", "value": "gpu", "effect": "NoSchedule"},
        ]},
    }))
    .unwrap();
    admin.create(&PostParams::default(), &n).await.unwrap();
    name
}

async fn patch(
    client: &kube::Client,
    node: &str,
    body: Value,
) -> Result<Node, Box<kube::core::Status>> {
    let api: Api<Node> = Api::all(client.clone());
    match api
        .patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(n) => Ok(n),
        Err(kube::Error::Api(e)) => Err(e),
        Err(e) => panic!("{e}"),
    }
}

async fn json_patch(
    client: &kube::Client,
    node: &str,
    ops: Value,
) -> Result<Node, Box<kube::core::Status>> {
    let api: Api<Node> = Api::all(client.clone());
    let p: json_patch::Patch = serde_json::from_value(ops).unwrap();
    match api
        .patch(node, &PatchParams::default(), &Patch::<()>::Json(p))
        .await
    {
        Ok(n) => Ok(n),
        Err(kube::Error::Api(e)) => Err(e),
        Err(e) => panic!("{e}"),
    }
}

fn assert_refused(what: &str, r: Result<Node, Box<kube::core::Status>>, needles: &[&str]) {
    let e = match r {
        Ok(_) => panic!("{what}: was allowed"),
        Err(e) => e,
    };
    assert_eq!(e.code, 403, "{what}: {}", e.message);
    for n in needles {
        assert!(e.message.contains(n), "{what}: {:?} lacks {n:?}", e.message);
    }
}

/// The node's taints but the lifecycle ones (`node.kubernetes.io/*`, which
/// the API server and its controllers add and remove).
async fn taints(c: &Cluster, node: &str) -> Vec<String> {
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let n = api.get(node).await.unwrap();
    n.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

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
    // Its own node: nothing but the gate.
    let refused: Vec<(&str, Value, String)> = vec![
        (
            "label its node (steer workloads)",
            json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            "metadata.labels".into(),
        ),
        (
            "switch the gate off",
            json!({"metadata": {"labels": {"nodegate.dev/exclude": "true"}}}),
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
            patch(&agent_a, &a, body).await,
            &[AGENT_POLICY, &on_a, &field, &format!("node '{a}'")],
        );
    }
    assert_refused(
        "remove a foreign taint on its node",
        json_patch(
            &agent_a,
            &a,
            json!([
                {"op": "test", "path": "/spec/taints/1/key", "value": "example.com/dedicated"},
                {"op": "remove", "path": "/spec/taints/1"},
            ]),
        )
        .await,
        &[
            AGENT_POLICY,
            &on_a,
            "may change only the taints",
            "example.com/dedicated",
        ],
    );
    assert_eq!(
        taints(&c, &a).await,
        [
            format!("{TAINT_KEY}:NoSchedule"),
            "example.com/dedicated:NoSchedule".to_string()
        ],
        "nothing changed"
    );

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

    // What the agent does: remove its taint and record the boot, add it back.
    // One annotation key, never the whole map: replacing it would drop the
    // annotations controllers add (the policy rightly refuses that).
    let key = format!(
        "/metadata/annotations/{}",
        READY_BOOT_ID_ANNOTATION.replace('/', "~1")
    );
    let ready = json_patch(
        &agent_a,
        &a,
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
    assert_eq!(taints(&c, &a).await, ["example.com/dedicated:NoSchedule"]);
    json_patch(
        &agent_a,
        &a,
        json!([{"op": "add", "path": "/spec/taints/-",
                "value": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}}]),
    )
    .await
    .unwrap();
    assert_eq!(
        taints(&c, &a).await,
        [
            "example.com/dedicated:NoSchedule".to_string(),
            format!("{TAINT_KEY}:NoSchedule")
        ]
    );
    // Everyone else is never evaluated: the admin still labels and uncordons.
    patch(
        &admin,
        &a,
        json!({"metadata": {"labels": {"x": "y"}}, "spec": {"unschedulable": null}}),
    )
    .await
    .unwrap();
}

/// Upgrades: the agent may remove the taint nodegate added by default before
/// it had a key of its own, exactly as it was added (`--release-taint`), and
/// nothing else under that key: Cilium's operator keeps its own taint there
/// with an empty value. It may never add the old taint.
#[tokio::test]
async fn a_stolen_agent_token_releases_only_the_old_default_taint() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-release").await;
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

#[tokio::test]
async fn the_webhook_token_can_only_add_the_taint() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-w").await;
    let webhook = c.client(users::WEBHOOK).await.unwrap();
    // Remove the gate as admin, so the webhook has something to add.
    let admin = c.client(users::ADMIN).await.unwrap();
    json_patch(
        &admin,
        &a,
        json!([{"op": "remove", "path": "/spec/taints/0"}]),
    )
    .await
    .unwrap();
    let webhook_policy = "ValidatingAdmissionPolicy 'nodegate-webhook-confinement'";
    assert_refused(
        "webhook removes a taint",
        json_patch(
            &webhook,
            &a,
            json!([{"op": "remove", "path": "/spec/taints/0"}]),
        )
        .await,
        &[webhook_policy, "may only add the taints"],
    );
    assert_refused(
        "webhook adds a foreign taint",
        json_patch(
            &webhook,
            &a,
            json!([{"op": "add", "path": "/spec/taints/-",
            "value": {"key": "example.com/evil", "effect": "NoExecute"}}]),
        )
        .await,
        &[webhook_policy, "may only add the taints"],
    );
    assert_refused(
        "webhook labels",
        patch(
            &webhook,
            &a,
            json!({"metadata": {"labels": {"nodegate.dev/exclude": "true"}}}),
        )
        .await,
        &[webhook_policy, "may change nothing but spec.taints"],
    );
    json_patch(
        &webhook,
        &a,
        json!([{"op": "add", "path": "/spec/taints/-",
        "value": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}}]),
    )
    .await
    .unwrap();
    assert_eq!(
        taints(&c, &a).await,
        [
            "example.com/dedicated:NoSchedule".to_string(),
            format!("{TAINT_KEY}:NoSchedule")
        ]
    );
}

/// Only the publisher writes the roster: a namespace editor (RBAC `edit` on
/// ConfigMaps in `nodegate`) can neither rewrite, create nor delete a shard;
/// the publisher's token can; other ConfigMaps are untouched by the policy.
/// Emulator only: it needs an editor RoleBinding, which the emulator takes
/// as RBAC input rather than through its API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_editor_cannot_rewrite_the_roster() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use nodegate_emulator::{Emulator, EmulatorOptions};
    if std::env::var_os("NODEGATE_E2E_KUBECONFIG").is_some() {
        eprintln!("skipped on a real cluster: needs an editor RoleBinding");
        return;
    }
    let mut rbac = nodegate_e2e::process::shipped_rbac().unwrap();
    rbac.push(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: editor, namespace: nodegate}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: editor}
subjects: [{kind: User, name: editor}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: editor}
rules: [{apiGroups: [""], resources: [configmaps], verbs: ["*"]}]
"#
        .into(),
    );
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac),
        ..Default::default()
    })
    .await
    .unwrap();
    emu.apply(&nodegate_e2e::process::shipped_roster_policy().unwrap())
        .unwrap();
    let shard = |name: &str, body: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "nodegate",
                         "labels": {"nodegate.dev/roster": "nodegate-roster"}},
            "data": {"shard.json": body},
        }))
        .unwrap()
    };
    let as_user = |u: &'static str| {
        let emu = &emu;
        async move { Api::<ConfigMap>::namespaced(emu.client(u).await.unwrap(), "nodegate") }
    };
    let publisher = as_user(users::ROSTER).await;
    let editor = as_user("editor").await;
    publisher
        .create(&PostParams::default(), &shard("nodegate-roster-0", "{}"))
        .await
        .unwrap();
    let poison = r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#;
    let refused = |r: Result<ConfigMap, kube::Error>, what: &str| match r {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{what}: {}", e.message);
            assert!(
                e.message.contains(
                    "only the nodegate-roster ServiceAccount may write roster shards, not editor"
                ),
                "{what}: {}",
                e.message
            );
        }
        other => panic!("{what}: {other:?}"),
    };
    let mut cur = publisher.get("nodegate-roster-0").await.unwrap();
    cur.data = Some([("shard.json".to_string(), poison.to_string())].into());
    refused(
        editor
            .replace("nodegate-roster-0", &PostParams::default(), &cur)
            .await,
        "rewrite",
    );
    refused(
        editor
            .create(&PostParams::default(), &shard("nodegate-roster-9", poison))
            .await,
        "create",
    );
    // An unlabelled look-alike name is a shard too.
    let mut bare = shard("nodegate-roster-7", poison);
    bare.metadata.labels = None;
    refused(
        editor.create(&PostParams::default(), &bare).await,
        "create unlabelled",
    );
    match editor
        .delete("nodegate-roster-0", &Default::default())
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{}", e.message),
        other => panic!("delete: {other:?}"),
    }
    assert_eq!(
        publisher
            .get("nodegate-roster-0")
            .await
            .unwrap()
            .data
            .unwrap()["shard.json"],
        "{}"
    );
    // The policy is about shards only; the publisher still writes them.
    let mut other: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "unrelated", "namespace": "nodegate"}, "data": {"a": "b"}}))
    .unwrap();
    other = editor.create(&PostParams::default(), &other).await.unwrap();
    assert_eq!(other.data.unwrap()["a"], "b");
    publisher
        .replace("nodegate-roster-0", &PostParams::default(), &cur)
        .await
        .unwrap();
}

/// Strict mode's boot gate evicts every workload that does not tolerate it,
/// so a stolen agent token must not be able to put it on its node while the
/// node runs the boot it recorded as ready, nor move the record to make it
/// look rebooted. On a real boot change the agent's safety net needs it.
/// Emulator only: a real cluster runs one install, and the real-nodes suite
/// attacks the strict-mode install there.
#[tokio::test]
async fn in_strict_mode_a_stolen_agent_token_cannot_evict_its_nodes_workloads() {
    use nodegate_shared::keys::DEFAULT_TAINT;
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        println!("skipped on a real cluster: e2e/real-nodes attacks the strict-mode install");
        return;
    };
    let gate = json!({"key": TAINT_KEY, "value": "true", "effect": "NoExecute"});
    emu.apply(&nodegate_webhook::confinement::render(
        &[DEFAULT_TAINT.parse().unwrap()],
        &["nodegate.dev/agent-not-ready=true:NoExecute"
            .parse()
            .unwrap()],
        &[],
    ))
    .unwrap();
    let a = node(&c, "strict-a").await;
    let admin = c.client(users::ADMIN).await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let boot = |id: &str| json!({"status": {"nodeInfo": {"bootID": id}}});
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
    let agent = c.agent_client(&a).await.unwrap();
    let add_gate = json!([{"op": "add", "path": "/spec/taints/-", "value": gate}]);
    let gate_msg = "may add the boot gate nodegate.dev/agent-not-ready:NoExecute";
    let record_msg = "only to the node's current bootID, and not remove it";

    assert_refused(
        "gate on the boot recorded as ready",
        json_patch(&agent, &a, add_gate.clone()).await,
        &[AGENT_POLICY, gate_msg, &a],
    );
    let ann = format!(
        "/metadata/annotations/{}",
        READY_BOOT_ID_ANNOTATION.replace('/', "~1")
    );
    assert_refused(
        "record removed",
        json_patch(&agent, &a, json!([{"op": "remove", "path": ann}])).await,
        &[AGENT_POLICY, record_msg],
    );
    assert_refused(
        "record moved to another boot",
        json_patch(
            &agent,
            &a,
            json!([{"op": "replace", "path": ann, "value": "b0"}]),
        )
        .await,
        &[AGENT_POLICY, record_msg],
    );
    // Both in one write: the rule reads the stored record.
    assert_refused(
        "record moved and gate added at once",
        json_patch(
            &agent,
            &a,
            json!([{"op": "replace", "path": ann, "value": "b0"},
                   {"op": "add", "path": "/spec/taints/-", "value": gate}]),
        )
        .await,
        &[AGENT_POLICY],
    );
    assert_eq!(
        taints(&c, &a).await,
        [
            "nodegate.dev/agent-not-ready:NoSchedule",
            "example.com/dedicated:NoSchedule"
        ]
    );

    // The node reboots: the safety net's write goes through, and so does
    // the ready patch of the new boot, which removes both.
    nodes
        .patch_status(&a, &PatchParams::default(), &Patch::Merge(boot("b2")))
        .await
        .unwrap();
    json_patch(&agent, &a, add_gate).await.unwrap();
    assert!(
        taints(&c, &a)
            .await
            .contains(&"nodegate.dev/agent-not-ready:NoExecute".to_string())
    );
    let gated = nodes.get(&a).await.unwrap();
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
    let mut ready: Vec<Value> = ours
        .iter()
        .map(|i| json!({"op": "remove", "path": format!("/spec/taints/{i}")}))
        .collect();
    ready.push(json!({"op": "replace", "path": ann, "value": "b2"}));
    json_patch(&agent, &a, json!(ready)).await.unwrap();
    assert_eq!(taints(&c, &a).await, ["example.com/dedicated:NoSchedule"]);
    assert_refused(
        "record moved back to the old boot",
        json_patch(
            &agent,
            &a,
            json!([{"op": "replace", "path": ann, "value": "b1"}]),
        )
        .await,
        &[AGENT_POLICY, record_msg],
    );
}
