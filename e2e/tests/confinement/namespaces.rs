//! The install's namespace: an editor of `nodegate` cannot rewrite the
//! roster, and an install moved to another namespace by kustomize still
//! confines its agent. Emulator only: both need RBAC the emulator takes as
//! input rather than through its API.

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_shared::keys::EXCLUDE_LABEL;
use serde_json::json;

use crate::support::credentials::{bound_token_request, token_client};
use crate::support::node_writes::{json_patch, patch};
use crate::support::refusals::{AGENT_POLICY, assert_refused};
use crate::support::taints::TAINT_KEY;

/// Only the publisher writes the roster: a namespace editor (RBAC `edit` on
/// ConfigMaps in `nodegate`) can neither rewrite, create nor delete a shard;
/// the publisher's token can; other ConfigMaps are untouched by the policy.
/// Emulator only: it needs an editor RoleBinding, which the emulator takes
/// as RBAC input rather than through its API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_editor_cannot_rewrite_the_roster() {
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

/// Installed under kustomize's `namespace:` (here `platform-gates`), the
/// agent's account is `system:serviceaccount:platform-gates:nodegate-agent`:
/// the shipped policies still confine it (they match the account's name in
/// any namespace), so its token of node A may remove A's gate and nothing
/// more. Emulator only: it needs RBAC for an account of another namespace,
/// which the emulator takes as input rather than through its API.
#[tokio::test]
async fn installed_in_another_namespace_the_agent_is_still_confined() {
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
    let request = bound_token_request("Pod", pod.metadata.name.clone(), pod.metadata.uid.clone());
    let token = Api::<ServiceAccount>::namespaced(admin_client, "platform-gates")
        .create_token_request("nodegate-agent", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let agent = token_client(&emu.kubeconfig(users::ADMIN).unwrap(), token).await;
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
