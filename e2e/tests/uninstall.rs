//! The removal (`nodegate-certs uninstall`, the kustomize removal's Job and
//! Helm's pre-delete hook) in the emulator, as its own ServiceAccount under
//! the shipped RBAC: every node left schedulable, strict mode's boot gate
//! and other owners' taints included or kept, no admission object left,
//! Helm's objects left to Helm, and its token reaching no further than the
//! radius its RBAC states.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use nodegate_certs::uninstall::{self, Options};
use nodegate_e2e::process::{WEBHOOK_NAMESPACE, manifests_dir, shipped_rbac};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use serde_json::json;

const UNINSTALL_USER: &str = "system:serviceaccount:nodegate:nodegate-uninstall";
const GATE: &str = "nodegate.dev/agent-not-ready";

fn kustomize(dir: &str) -> String {
    let out = std::process::Command::new("kubectl")
        .args(["kustomize", dir])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn options() -> Options {
    Options {
        namespace: WEBHOOK_NAMESPACE.into(),
        gate_keys: nodegate_certs::cli::shipped_gate_keys(),
        agent_daemonset: "nodegate-agent".into(),
        agent_selector: "app.kubernetes.io/name=nodegate-agent".into(),
        webhook_config: "nodegate".into(),
        own_name: "nodegate-uninstall".into(),
        agents_timeout: Duration::from_secs(10),
        certs_deployment: "nodegate-certs".into(),
        secrets: vec![
            "nodegate-webhook-ca".into(),
            "nodegate-webhook-tls".into(),
            "nodegate-webhook-path".into(),
        ],
        test_pod: "nodegate-check".into(),
    }
}

/// The whole install as `kubectl apply -k` leaves it (with `helm`: as Helm
/// labels it, namespace made by `--create-namespace`), and three nodes:
/// one gated, one gated with strict mode's boot gate beside Cilium's
/// operator's taint, one open.
async fn installed(helm: bool) -> Emulator {
    let uninstall = manifests_dir().join("../uninstall/rbac.yaml");
    let mut rbac = shipped_rbac().unwrap();
    rbac.push(std::fs::read_to_string(uninstall).unwrap());
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(rbac),
        ..Default::default()
    })
    .await
    .unwrap();
    let base = manifests_dir();
    let mut docs =
        nodegate_emulator::server::parse_documents(&kustomize(base.join("..").to_str().unwrap()))
            .unwrap();
    if helm {
        docs.retain(|d| d["kind"] != "Namespace");
        for d in &mut docs {
            d["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("Helm");
        }
        emu.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WEBHOOK_NAMESPACE}}).to_string())
            .unwrap();
    }
    docs.extend(
        nodegate_emulator::server::parse_documents(&kustomize(
            base.join("../uninstall").to_str().unwrap(),
        ))
        .unwrap(),
    );
    for d in docs {
        // What the emulator does not serve (ServiceAccounts) plays no part.
        if let Err(e) = emu.apply(&d.to_string()) {
            assert!(e.to_string().contains("does not serve"), "{e:#}");
        }
    }
    // What the certificates controller made, which neither Helm nor
    // kustomize knows.
    for name in [
        "nodegate-webhook-ca",
        "nodegate-webhook-tls",
        "nodegate-webhook-path",
    ] {
        emu.apply(
            &json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": WEBHOOK_NAMESPACE,
                             "labels": {"app.kubernetes.io/part-of": "nodegate"}},
                "data": {"k": "dg=="}})
            .to_string(),
        )
        .unwrap();
    }
    // An agent Pod, which the garbage collector deletes once its DaemonSet goes.
    emu.apply(
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "nodegate-agent-x", "namespace": WEBHOOK_NAMESPACE,
                         "labels": {"app.kubernetes.io/name": "nodegate-agent"}},
            "spec": {"nodeName": "gated", "containers": [{"name": "agent", "image": "nodegate/nodegate-agent"}]}})
        .to_string(),
    )
    .unwrap();
    let admin = emu.client(users::ADMIN).await.unwrap();
    let nodes: Api<Node> = Api::all(admin);
    for (name, taints) in [
        (
            "gated",
            json!([{"key": GATE, "value": "true", "effect": "NoSchedule"}]),
        ),
        (
            "rebooted",
            json!([
                {"key": GATE, "value": "true", "effect": "NoSchedule"},
                {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"},
                {"key": GATE, "value": "true", "effect": "NoExecute"},
            ]),
        ),
        ("open", json!([])),
    ] {
        SimKubelet::new(&emu, name)
            .await
            .unwrap()
            .register()
            .await
            .unwrap();
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await
            .unwrap();
    }
    emu
}

async fn taint_keys(emu: &Emulator, node: &str) -> Vec<(String, String)> {
    let nodes: Api<Node> = Api::all(emu.client(users::ADMIN).await.unwrap());
    nodes
        .get(node)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

async fn names(emu: &Emulator, kind: &str, plural: &str) -> Vec<String> {
    let client = emu.client(users::ADMIN).await.unwrap();
    let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<kube::api::DynamicObject> = Api::all_with(client, &ar);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kustomize_removal_opens_every_node_and_leaves_nothing() {
    let emu = installed(false).await;
    let collector = collect_agents_async(&emu).await;
    let client = emu.client(UNINSTALL_USER).await.unwrap();
    let left = uninstall::run(client, &options()).await.unwrap();
    collector.await.unwrap();
    assert_eq!(left, vec![], "nothing left behind");

    assert_eq!(taint_keys(&emu, "gated").await, vec![]);
    assert_eq!(
        taint_keys(&emu, "rebooted").await,
        vec![("node.cilium.io/agent-not-ready".into(), "NoSchedule".into())],
        "both gates gone, Cilium operator's taint kept"
    );
    assert_eq!(
        names(
            &emu,
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations"
        )
        .await,
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            &emu,
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies"
        )
        .await,
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            &emu,
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings"
        )
        .await,
        Vec::<String>::new()
    );
    // The emulator serves no RBAC objects: their deletion, and the
    // removal's own handed to the namespace, are shown on real nodes
    // (e2e/real-nodes, the kustomize removal scenario).
    let admin = emu.client(users::ADMIN).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(admin);
    let ns = namespaces.get_opt(WEBHOOK_NAMESPACE).await.unwrap();
    assert!(
        ns.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "the namespace is deleted last"
    );
}

/// The garbage collector's part: the agent's Pods go once their DaemonSet has.
async fn collect_agents_async(emu: &Emulator) -> tokio::task::JoinHandle<()> {
    let client = emu.client(users::ADMIN).await.unwrap();
    tokio::spawn(async move {
        let sets: Api<DaemonSet> = Api::namespaced(client.clone(), WEBHOOK_NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(client, WEBHOOK_NAMESPACE);
        let end = tokio::time::Instant::now() + Duration::from_secs(20);
        while sets.get_opt("nodegate-agent").await.unwrap().is_some() {
            assert!(
                tokio::time::Instant::now() < end,
                "the DaemonSet was never deleted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pods.delete("nodegate-agent-x", &DeleteParams::default())
            .await
            .unwrap();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_helm_it_opens_the_nodes_and_leaves_helms_objects_to_helm() {
    let emu = installed(true).await;
    let collector = collect_agents_async(&emu).await;
    let client = emu.client(UNINSTALL_USER).await.unwrap();
    let left = uninstall::run(client, &options()).await.unwrap();
    collector.await.unwrap();
    assert_eq!(left, vec![]);
    for node in ["gated", "rebooted", "open"] {
        assert!(
            !taint_keys(&emu, node).await.iter().any(|(k, _)| k == GATE),
            "{node} still gated"
        );
    }
    assert_eq!(
        names(
            &emu,
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations"
        )
        .await,
        Vec::<String>::new(),
        "the webhook configuration goes first, even Helm's"
    );
    assert!(
        names(
            &emu,
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies"
        )
        .await
        .contains(&"nodegate-agent-confinement".to_string()),
        "Helm deletes the rest itself"
    );
    let admin = emu.client(users::ADMIN).await.unwrap();
    let ns = Api::<Namespace>::all(admin)
        .get(WEBHOOK_NAMESPACE)
        .await
        .unwrap();
    assert!(
        ns.metadata.deletion_timestamp.is_none(),
        "a namespace Helm did not make stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_finds_nothing_to_do() {
    let emu = installed(true).await;
    let collector = collect_agents_async(&emu).await;
    let o = options();
    uninstall::run(emu.client(UNINSTALL_USER).await.unwrap(), &o)
        .await
        .unwrap();
    collector.await.unwrap();
    let left = uninstall::run(emu.client(UNINSTALL_USER).await.unwrap(), &o)
        .await
        .unwrap();
    assert_eq!(left, vec![], "a retried Job skips what is done");
}

fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_removals_token_reaches_no_further_than_its_radius() {
    let emu = installed(false).await;
    let client = emu.client(UNINSTALL_USER).await.unwrap();
    let dp = DeleteParams::default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), WEBHOOK_NAMESPACE);
    forbidden(
        "reading a Secret",
        secrets.get("nodegate-webhook-tls").await,
    );
    let dyn_api = |kind: &str, plural: &str| {
        let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
        let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
        Api::<kube::api::DynamicObject>::all_with(client.clone(), &ar)
    };
    forbidden(
        "deleting another webhook configuration",
        dyn_api(
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
        )
        .delete("someone-elses", &dp)
        .await,
    );
    forbidden(
        "deleting another policy",
        dyn_api("ValidatingAdmissionPolicy", "validatingadmissionpolicies")
            .delete("someone-elses", &dp)
            .await,
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    forbidden(
        "deleting another namespace",
        namespaces.delete("kube-system", &dp).await,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), WEBHOOK_NAMESPACE);
    forbidden(
        "creating a Pod",
        pods.create(
            &Default::default(),
            &serde_json::from_value::<Pod>(json!({
                "metadata": {"name": "x"}, "spec": {"containers": [{"name": "x", "image": "x"}]}
            }))
            .unwrap(),
        )
        .await,
    );
    let sets: Api<DaemonSet> = Api::namespaced(client, WEBHOOK_NAMESPACE);
    forbidden(
        "changing the agent DaemonSet",
        sets.patch(
            "nodegate-agent",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minReadySeconds": 1}})),
        )
        .await,
    );
}

/// Every cluster-scoped object of every configuration the chart's CI
/// renders (base, each component, the admission-policy overlay), and every
/// Role outside the install's namespace, is one the removal's role may
/// delete by name: an object added to the install without its name here
/// would be left behind.
#[test]
fn the_removal_may_delete_every_cluster_scoped_object_of_every_configuration() {
    let rbac = std::fs::read_to_string(manifests_dir().join("../uninstall/rbac.yaml")).unwrap();
    let role = nodegate_emulator::server::parse_documents(&rbac)
        .unwrap()
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .unwrap();
    let deletable = |resource: &str, name: &str| {
        role["rules"].as_array().unwrap().iter().any(|r| {
            let has = |k: &str, v: &str| r[k].as_array().is_some_and(|a| a.iter().any(|x| x == v));
            has("resources", resource) && has("verbs", "delete") && has("resourceNames", name)
        })
    };
    let configs = manifests_dir().join("../../charts/nodegate/ci/kustomize");
    let mut seen = 0;
    for entry in std::fs::read_dir(&configs).unwrap() {
        let dir = entry.unwrap().path();
        for d in
            nodegate_emulator::server::parse_documents(&kustomize(dir.to_str().unwrap())).unwrap()
        {
            let outside = d["metadata"]["namespace"]
                .as_str()
                .is_some_and(|ns| ns != WEBHOOK_NAMESPACE);
            let plural = match d["kind"].as_str().unwrap() {
                "Role" if outside => "roles",
                "RoleBinding" if outside => "rolebindings",
                "ClusterRole" => "clusterroles",
                "ClusterRoleBinding" => "clusterrolebindings",
                "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
                "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
                "MutatingAdmissionPolicy" => "mutatingadmissionpolicies",
                "MutatingAdmissionPolicyBinding" => "mutatingadmissionpolicybindings",
                "MutatingWebhookConfiguration" => "mutatingwebhookconfigurations",
                "Namespace" => "namespaces",
                _ => continue,
            };
            let name = d["metadata"]["name"].as_str().unwrap();
            assert!(
                deletable(plural, name),
                "{} {name} of {} is not in manifests/uninstall/rbac.yaml",
                d["kind"],
                dir.display()
            );
            seen += 1;
        }
    }
    assert!(
        seen > 20,
        "only {seen} objects: were the configurations found?"
    );
}
