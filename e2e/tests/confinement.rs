//! nodegate's own credentials, attacked as a thief would use them: the
//! agent's pod-bound token of node A, the same ServiceAccount's token without
//! a node claim or bound to the Node instead of a pod, and the webhook's
//! token, against the shipped install (RBAC plus the confinement
//! ValidatingAdmissionPolicies). Every forbidden change must be refused (403,
//! naming the node and the field) and every change the workloads need must
//! go through. Runs against a fresh emulator, or a real cluster when
//! NODEGATE_E2E_KUBECONFIG is set (see e2e/README.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::{EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use serde_json::{Value, json};

const TAINT_KEY: &str = "nodegate.dev/agent-not-ready";
const AGENT_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-agent-confinement' with binding 'nodegate-agent-confinement'";
const WEBHOOK_POLICY: &str = "ValidatingAdmissionPolicy 'nodegate-webhook-confinement'";

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
    json_patch_with(client, node, ops, &PatchParams::default()).await
}

async fn json_patch_with(
    client: &kube::Client,
    node: &str,
    ops: Value,
    pp: &PatchParams,
) -> Result<Node, Box<kube::core::Status>> {
    let api: Api<Node> = Api::all(client.clone());
    let p: json_patch::Patch = serde_json::from_value(ops).unwrap();
    match api.patch(node, pp, &Patch::<()>::Json(p)).await {
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
    {
        let admin = c.client(users::ADMIN).await.unwrap();
        let agent_a = c.agent_client(&a).await.unwrap();
        let legacy = json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
        json_patch(
            &admin,
            &a,
            json!([{"op": "add", "path": "/spec/taints/-", "value": legacy}]),
        )
        .await
        .unwrap();
        let stored =
            serde_json::to_value(Api::<Node>::all(admin.clone()).get(&a).await.unwrap()).unwrap();
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
                &a,
                json!([{"op": "test", "path": format!("/spec/taints/{i}"), "value": legacy},
                {"op": "remove", "path": format!("/spec/taints/{i}")}]),
            )
            .await,
            &[AGENT_POLICY, "may change only the taints"],
        );
        json_patch(
            &admin,
            &a,
            json!([{"op": "remove", "path": format!("/spec/taints/{i}")}]),
        )
        .await
        .unwrap();
    }
    let Some(emu) = c.emulator() else { return };
    emu.apply(include_str!(
        "../../manifests/components/release-cilium-key/confinement.yaml"
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
            json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}}),
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

/// A client acting as `user` with the user extras `extra`, impersonated by
/// the admin (both modes: the emulator honours `Impersonate-Extra-*` too).
async fn impersonating(c: &Cluster, user: &str, extra: &[(&str, &str)]) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig(users::ADMIN).unwrap()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(
        users::groups(user)
            .into_iter()
            .filter(|g| g != "system:authenticated")
            .collect(),
    );
    cfg.auth_info.impersonate_user_extra = Some(
        extra
            .iter()
            .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
            .collect(),
    );
    kube::Client::try_from(cfg).unwrap()
}

/// The agent ServiceAccount's token bound to Node `node` itself
/// (TokenRequest with `boundObjectRef` kind Node): the node claims, no pod.
/// Where the API server issues none (the emulator, a cluster without
/// `ServiceAccountTokenNodeBinding`: 400), the same identity impersonated.
async fn node_bound_agent(c: &Cluster, node: &str) -> (kube::Client, &'static str) {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    let admin = c.client(users::ADMIN).await.unwrap();
    let uid = Api::<Node>::all(admin.clone())
        .get(node)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                uid: Some(uid.clone()),
            }),
            expiration_seconds: Some(3600),
        },
        ..Default::default()
    };
    let sas: Api<ServiceAccount> = Api::namespaced(admin, "nodegate");
    match sas
        .create_token_request("nodegate-agent", &PostParams::default(), &request)
        .await
    {
        Ok(r) => {
            let kc =
                kube::config::Kubeconfig::read_from(c.kubeconfig(users::ADMIN).unwrap()).unwrap();
            let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            // Only the token: no client certificate, plugin or impersonation.
            cfg.auth_info = kube::config::AuthInfo {
                token: Some(r.status.unwrap().token.into()),
                ..Default::default()
            };
            (kube::Client::try_from(cfg).unwrap(), "TokenRequest")
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

/// What a real API server records when the admin creates [`node`]'s Node
/// (measured on kube-apiserver: one update entry of the client's manager).
fn creation_entry(manager: &str) -> Value {
    json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
           "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
           "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}},
                                       "f:labels": {".": {}, "f:kubernetes.io/hostname": {}}},
                        "f:spec": {"f:taints": {}}}})
}

/// An update entry of `manager` at `time` owning `fields`.
fn update_entry(manager: &str, time: &str, fields: Value) -> Value {
    json!({"manager": manager, "operation": "Update", "apiVersion": "v1", "time": time,
           "fieldsType": "FieldsV1", "fieldsV1": fields})
}

fn set_ownership(entries: &Value) -> Value {
    // `add` replaces the member when it exists, and creates it when not.
    json!([{"op": "add", "path": "/metadata/managedFields", "value": entries}])
}

/// The node's field ownership as stored.
async fn ownership(c: &Cluster, node: &str) -> Vec<Value> {
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let n = serde_json::to_value(api.get(node).await.unwrap()).unwrap();
    n["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The emulator keeps no field ownership (emulator/README.md): give the
/// test's node what a real API server records at its creation. A real
/// cluster has recorded it already.
/// Whether the API server records field ownership: a real one does for the
/// Node's create; the emulator keeps none, also when it is the "real"
/// cluster of real-cluster mode (`nodegate-sim serve`).
async fn records_ownership(c: &Cluster, node: &str) -> bool {
    !ownership(c, node).await.is_empty()
}

async fn recorded_ownership(c: &Cluster, node: &str) -> Vec<Value> {
    if !records_ownership(c, node).await {
        let admin = c.client(users::ADMIN).await.unwrap();
        json_patch(
            &admin,
            node,
            set_ownership(&json!([creation_entry("nodegate-e2e")])),
        )
        .await
        .unwrap();
    }
    ownership(c, node).await
}

fn managers(entries: &[Value]) -> Vec<String> {
    let mut m: Vec<String> = entries
        .iter()
        .map(|e| format!("{} ({})", e["manager"], e["operation"]))
        .collect();
    m.sort();
    m
}

/// `metadata.managedFields` decides what a server-side apply deletes: a
/// manager's apply prunes the fields its apply entry owned and no longer
/// sets, unless another manager owns them too. A write may carry its own
/// managedFields, and the API server takes them (`decodeLiveOrNew`), so a
/// stolen token could make any applier the sole owner of `spec.taints` — its
/// next apply deletes every taint. Both tokens may leave only what the API
/// server's field manager records for their own writes.
#[tokio::test]
async fn a_stolen_token_cannot_forge_field_ownership() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-owners").await;
    let records = records_ownership(&c, &a).await;
    let before = recorded_ownership(&c, &a).await;
    let agent = c.agent_client(&a).await.unwrap();
    let webhook = c.client(users::WEBHOOK).await.unwrap();
    let forged = json!({"manager": "x", "operation": "Apply", "apiVersion": "v1",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:taints": {}}}});
    let replace =
        |v: Value| json!([{"op": "replace", "path": "/metadata/managedFields", "value": v}]);
    let mut beside = before.clone();
    beside.push(forged.clone());
    for (who, client, policy) in [
        ("agent", &agent, AGENT_POLICY),
        ("webhook", &webhook, WEBHOOK_POLICY),
    ] {
        let tries = [
            // The reported attack: x alone owns spec.taints.
            ("x alone owns spec.taints", replace(json!([forged]))),
            // x's apply entry beside the recorded ones: still x's to prune.
            ("x owns spec.taints too", replace(json!(beside))),
            // An empty list resets ownership: nobody holds anything.
            ("ownership reset", replace(json!([]))),
        ];
        for (what, ops) in tries {
            assert_refused(
                &format!("{who}: {what}"),
                json_patch(client, &a, ops).await,
                &[
                    policy,
                    "may not rewrite metadata.managedFields",
                    &format!("node '{a}'"),
                ],
            );
        }
    }
    // Inside a write the agent may make (its ready patch): the creator's
    // entry dropped, so an applier's omission could prune its labels.
    let key = format!(
        "/metadata/annotations/{}",
        READY_BOOT_ID_ANNOTATION.replace('/', "~1")
    );
    let own = update_entry(
        "nodegate-agent",
        "2026-01-01T00:00:01Z",
        json!({"f:metadata": {"f:annotations": {format!("f:{READY_BOOT_ID_ANNOTATION}"): {}}},
               "f:spec": {"f:taints": {}}}),
    );
    assert_refused(
        "agent: ready patch dropping the creator's ownership",
        json_patch(
            &agent,
            &a,
            json!([
                {"op": "test", "path": "/spec/taints/0/key", "value": TAINT_KEY},
                {"op": "remove", "path": "/spec/taints/0"},
                {"op": "add", "path": key, "value": "boot-1"},
                {"op": "replace", "path": "/metadata/managedFields", "value": [own]},
            ]),
        )
        .await,
        &[AGENT_POLICY, "may not rewrite metadata.managedFields"],
    );
    assert_eq!(
        managers(&ownership(&c, &a).await),
        managers(&before),
        "ownership unchanged"
    );
    assert_eq!(
        taints(&c, &a).await,
        [
            format!("{TAINT_KEY}:NoSchedule"),
            "example.com/dedicated:NoSchedule".to_string()
        ],
        "taints unchanged"
    );

    // What the policy stands between: on a real API server the same forgery
    // (here by the unconfined admin) and x's apply of a Node without taints
    // delete every taint. The emulator has no server-side apply semantics,
    // also behind a kubeconfig (real-cluster mode against it).
    if records {
        let admin = c.client(users::ADMIN).await.unwrap();
        json_patch(&admin, &a, replace(json!([forged])))
            .await
            .unwrap();
        Api::<Node>::all(admin)
            .patch(
                &a,
                &PatchParams::apply("x"),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": a}})),
            )
            .await
            .unwrap();
        assert_eq!(
            taints(&c, &a).await,
            Vec::<String>::new(),
            "x's apply pruned the taints it was made to own"
        );
    }
}

/// The writes nodegate makes still go through while the API server records
/// their field ownership: the ready patch, the webhook's re-taint, the next
/// ready patch (which drops the webhook's entry), beside an applier's entry,
/// and past the 10 update managers at which the API server merges the
/// oldest into `ancient-changes`. On a real cluster the API server writes
/// managedFields itself; the emulator keeps none, so there each write
/// carries what the field manager would record (apimachinery
/// `managedfields/internal`, structured-merge-diff `merge/update.go`).
#[tokio::test]
async fn recorded_field_ownership_lets_the_workloads_write() {
    let c = Cluster::start().await.unwrap();
    let a = node(&c, "conf-recorded").await;
    let admin = c.client(users::ADMIN).await.unwrap();
    let agent = c.agent_client(&a).await.unwrap();
    let webhook = c.client(users::WEBHOOK).await.unwrap();
    let emulated = !records_ownership(&c, &a).await;
    // Named managers: each write of theirs is an entry of its own, so the
    // webhook's last write adds one past the cap on a real API server too.
    let as_manager = |m: &str| PatchParams {
        field_manager: Some(m.into()),
        ..Default::default()
    };
    let (by_agent, by_webhook) = (as_manager("nodegate-agent"), as_manager("nodegate-webhook"));
    recorded_ownership(&c, &a).await;
    // An applier's label (its apply entry must survive every write below).
    let team = json!({"f:metadata": {"f:labels": {"f:example.com/team": {}}}});
    if emulated {
        patch(
            &admin,
            &a,
            json!({"metadata": {"labels": {"example.com/team": "a"}}}),
        )
        .await
        .unwrap();
        let mut entries = ownership(&c, &a).await;
        entries.push(
            json!({"manager": "x", "operation": "Apply", "apiVersion": "v1",
            "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": team}),
        );
        json_patch(&admin, &a, set_ownership(&json!(entries)))
            .await
            .unwrap();
    } else {
        Api::<Node>::all(admin.clone())
            .patch(
                &a,
                &PatchParams::apply("x"),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": a, "labels": {"example.com/team": "a"}}})),
            )
            .await
            .unwrap();
    }
    // On the emulator, the write's ops plus the ownership the API server
    // would record for it.
    let with_ownership = |mut ops: Value, entries: Value| {
        if emulated {
            ops.as_array_mut().unwrap().push(
                json!({"op": "replace", "path": "/metadata/managedFields", "value": entries}),
            );
        }
        ops
    };
    let ready_key = format!("f:{READY_BOOT_ID_ANNOTATION}");
    let creator_without_taints = json!({"manager": "nodegate-e2e", "operation": "Update",
        "apiVersion": "v1", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}},
                                    "f:labels": {".": {}, "f:kubernetes.io/hostname": {}}}}});
    let applier = json!({"manager": "x", "operation": "Apply", "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": team});
    let ann = format!(
        "/metadata/annotations/{}",
        READY_BOOT_ID_ANNOTATION.replace('/', "~1")
    );

    // The ready patch: the taint list changed, so the creator loses it and
    // the agent's entry holds it and the annotation.
    json_patch_with(
        &agent,
        &a,
        with_ownership(
            json!([
                {"op": "test", "path": "/spec/taints/0/key", "value": TAINT_KEY},
                {"op": "remove", "path": "/spec/taints/0"},
                {"op": "add", "path": ann, "value": "boot-1"},
            ]),
            json!([creator_without_taints, applier,
                update_entry("nodegate-agent", "2026-01-01T00:00:10Z",
                    json!({"f:metadata": {"f:annotations": {&ready_key: {}}}, "f:spec": {"f:taints": {}}}))]),
        ),
        &by_agent,
    )
    .await
    .expect("the ready patch");
    // The webhook's re-taint: the agent's entry loses the taints.
    let agent_entry = update_entry(
        "nodegate-agent",
        "2026-01-01T00:00:10Z",
        json!({"f:metadata": {"f:annotations": {&ready_key: {}}}}),
    );
    let gate = json!({"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"});
    json_patch_with(
        &webhook,
        &a,
        with_ownership(
            json!([{"op": "add", "path": "/spec/taints/-", "value": gate}]),
            json!([
                creator_without_taints,
                applier,
                agent_entry,
                update_entry(
                    "nodegate-webhook",
                    "2026-01-01T00:00:20Z",
                    json!({"f:spec": {"f:taints": {}}})
                )
            ]),
        ),
        &by_webhook,
    )
    .await
    .expect("the webhook's re-taint");
    // The next ready patch: the webhook's entry owned only the taints and
    // is dropped.
    let stored =
        serde_json::to_value(Api::<Node>::all(admin.clone()).get(&a).await.unwrap()).unwrap();
    let i = stored["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .position(|t| t["key"] == TAINT_KEY)
        .unwrap();
    json_patch_with(
        &agent,
        &a,
        with_ownership(
            json!([
                {"op": "test", "path": format!("/spec/taints/{i}/key"), "value": TAINT_KEY},
                {"op": "remove", "path": format!("/spec/taints/{i}")},
                {"op": "replace", "path": ann, "value": "boot-2"},
            ]),
            json!([creator_without_taints, applier,
                update_entry("nodegate-agent", "2026-01-01T00:00:30Z",
                    json!({"f:metadata": {"f:annotations": {&ready_key: {}}}, "f:spec": {"f:taints": {}}}))]),
        ),
        &by_agent,
    )
    .await
    .expect("the second ready patch");

    // Nine more update managers, each with a label of its own: with the
    // creator and the agent, 11 update entries, one over the cap.
    let label = |i: usize| format!("example.com/m{i}");
    let mut labelled = Vec::new();
    for i in 1..=9 {
        let body = json!({"metadata": {"labels": {label(i): "v"}}});
        let pp = PatchParams {
            field_manager: Some(format!("m{i}")),
            ..Default::default()
        };
        Api::<Node>::all(admin.clone())
            .patch(&a, &pp, &Patch::Merge(&body))
            .await
            .unwrap();
        labelled.push(update_entry(
            &format!("m{i}"),
            &format!("2026-01-01T00:01:0{i}Z"),
            json!({"f:metadata": {"f:labels": {format!("f:{}", label(i)): {}}}}),
        ));
    }
    // The emulator's stored state: what the API server keeps at the cap
    // (the creator and m1, the oldest, merged into the bucket).
    let bucket_of = |taints: bool| {
        let mut fields = json!({"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}},
            "f:labels": {".": {}, "f:kubernetes.io/hostname": {}, "f:example.com/m1": {}}}});
        if taints {
            fields["f:spec"] = json!({"f:taints": {}});
        }
        update_entry("ancient-changes", "2026-01-01T00:01:01Z", fields)
    };
    let agent_with_taints = update_entry(
        "nodegate-agent",
        "2026-01-01T00:00:30Z",
        json!({"f:metadata": {"f:annotations": {&ready_key: {}}}, "f:spec": {"f:taints": {}}}),
    );
    if emulated {
        let mut at_cap = vec![bucket_of(false), applier.clone(), agent_with_taints.clone()];
        at_cap.extend(labelled[1..].iter().cloned());
        json_patch(&admin, &a, set_ownership(&json!(at_cap)))
            .await
            .unwrap();
    }
    // The webhook's re-taint adds an 11th update entry: the API server
    // merges the oldest (the agent's, which lost the taints) into the bucket.
    let mut merged = vec![
        update_entry(
            "ancient-changes",
            "2026-01-01T00:00:30Z",
            json!({"f:metadata": {"f:annotations": {".": {}, "f:example.com/owner": {}, &ready_key: {}},
                "f:labels": {".": {}, "f:kubernetes.io/hostname": {}, "f:example.com/m1": {}}}}),
        ),
        applier.clone(),
        update_entry(
            "nodegate-webhook",
            "2026-01-01T00:02:00Z",
            json!({"f:spec": {"f:taints": {}}}),
        ),
    ];
    merged.extend(labelled[1..].iter().cloned());
    // A forged merge first: the bucket without the agent's annotation.
    if emulated {
        let mut forged = merged.clone();
        forged[0]["fieldsV1"]["f:metadata"]["f:annotations"]
            .as_object_mut()
            .unwrap()
            .remove(&ready_key);
        assert_refused(
            "webhook: a merge that drops the agent's ownership",
            json_patch_with(
                &webhook,
                &a,
                with_ownership(
                    json!([{"op": "add", "path": "/spec/taints/-", "value": gate}]),
                    json!(forged),
                ),
                &by_webhook,
            )
            .await,
            &[WEBHOOK_POLICY, "nodegate-agent (Update)"],
        );
    }
    json_patch_with(
        &webhook,
        &a,
        with_ownership(
            json!([{"op": "add", "path": "/spec/taints/-", "value": gate}]),
            json!(merged),
        ),
        &by_webhook,
    )
    .await
    .expect("the webhook's re-taint at the cap");
    let now = ownership(&c, &a).await;
    assert!(
        now.iter().any(|e| e["manager"] == "ancient-changes"),
        "the cap was reached: {:?}",
        managers(&now)
    );
    assert!(
        now.iter()
            .any(|e| e["manager"] == "x" && e["operation"] == "Apply" && e["fieldsV1"] == team),
        "the applier's entry is intact: {now:?}"
    );
    assert_eq!(
        taints(&c, &a).await,
        [
            "example.com/dedicated:NoSchedule".to_string(),
            format!("{TAINT_KEY}:NoSchedule")
        ]
    );
}

/// Installed under kustomize's `namespace:` (here `platform-gates`), the
/// agent's account is `system:serviceaccount:platform-gates:nodegate-agent`:
/// the shipped policies still confine it (they match the account's name in
/// any namespace), so its token of node A may remove A's gate and nothing
/// more. Emulator only: it needs RBAC for an account of another namespace,
/// which the emulator takes as input rather than through its API.
#[tokio::test]
async fn installed_in_another_namespace_the_agent_is_still_confined() {
    use nodegate_emulator::{Emulator, EmulatorOptions};
    if std::env::var_os("NODEGATE_E2E_KUBECONFIG").is_some() {
        eprintln!("skipped on a real cluster: needs RBAC for another namespace's account");
        return;
    }
    let mut rbac = nodegate_e2e::process::shipped_rbac().unwrap();
    rbac.push(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: nodegate-agent-platform-gates}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodegate-agent}
subjects: [{kind: ServiceAccount, name: nodegate-agent, namespace: platform-gates}]
"#
        .into(),
    );
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac),
        ..Default::default()
    })
    .await
    .unwrap();
    emu.apply(&nodegate_e2e::process::shipped_confinement().unwrap())
        .unwrap();
    let admin: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": "elsewhere", "annotations": {"example.com/owner": "nodegate-e2e"}},
        "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]},
    }))
    .unwrap();
    admin.create(&PostParams::default(), &n).await.unwrap();
    // The token of its pod on that node, from the TokenRequest API.
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    let admin_client = emu.client(users::ADMIN).await.unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nodegate-agent-abcde", "namespace": "platform-gates"},
        "spec": {"serviceAccountName": "nodegate-agent", "nodeName": "elsewhere",
                 "containers": [{"name": "agent", "image": "nodegate/nodegate-agent:e2e"}]},
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(admin_client.clone(), "platform-gates")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(3600),
        },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin_client, "platform-gates")
        .create_token_request("nodegate-agent", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let kc = kube::config::Kubeconfig::read_from(emu.kubeconfig(users::ADMIN).unwrap()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let agent = kube::Client::try_from(cfg).unwrap();
    assert_refused(
        "another namespace's agent switches its gate off",
        patch(
            &agent,
            "elsewhere",
            json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}}),
        )
        .await,
        &[
            AGENT_POLICY,
            "nodegate-agent of node 'elsewhere'",
            "metadata.labels",
        ],
    );
    json_patch(
        &agent,
        "elsewhere",
        json!([
            {"op": "test", "path": "/spec/taints/0/key", "value": TAINT_KEY},
            {"op": "remove", "path": "/spec/taints/0"},
        ]),
    )
    .await
    .expect("its ready patch");
}
