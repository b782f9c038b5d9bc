//! `nodegate-certs uninstall`: removes nodegate and leaves every node as it
//! was before, schedulable. Helm runs it as a pre-delete hook; the
//! kustomize removal (`kubectl apply -k manifests/uninstall`) as a Job.
//!
//! 1. The admission objects go first (webhook configuration, admission
//!    policy): nothing re-gates a node from then on.
//! 2. The certificates controller (it would make its Secrets again) and the
//!    agent DaemonSet go: an agent that sees its DaemonSet gone opens its
//!    node instead of re-gating it on SIGTERM.
//! 3. Every node's gates are removed, whatever its agent did: a node whose
//!    agent was not ready, or is down, or strict mode's boot gate; then the
//!    Pods are waited for (a slow kubelet delays no node) and every node
//!    opened again (an older agent re-gates its node on SIGTERM).
//! 4. The Secrets the controller made (CA key included), which neither Helm
//!    nor kustomize knows, and `helm test`'s Pod go; without Helm, the rest
//!    of the install: cluster-scoped objects by label, then the namespace
//!    (its own credential last, by ownership).
//! 5. What is left is listed, each with the command that finishes it, and
//!    the exit code says whether anything is.
//!
//! Its credential exists for the removal only: no Pod runs with it
//! otherwise, so there is no token of it to steal (docs/security.md).

pub mod plan;

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PropagationPolicy,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use plan::Leftover;

/// What the removal touches.
#[derive(Debug, Clone)]
pub struct Options {
    pub namespace: String,
    /// Every taint key nodegate may have put on a node.
    pub gate_keys: Vec<String>,
    pub agent_daemonset: String,
    /// Label selector of the agent's Pods.
    pub agent_selector: String,
    pub webhook_config: String,
    /// The removal's own ClusterRole and ClusterRoleBinding.
    pub own_name: String,
    /// How long the agents' Pods may take to stop.
    pub agents_timeout: Duration,
    /// The certificates controller's Deployment.
    pub certs_deployment: String,
    /// The Secrets it made: gone with the install.
    pub secrets: Vec<String>,
    /// `helm test`'s Pod.
    pub test_pod: String,
}

/// Cluster-scoped kinds an install may hold, admission objects first.
const CLUSTER_KINDS: &[(&str, &str, &str, &str)] = &[
    (
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "MutatingAdmissionPolicyBinding",
        "mutatingadmissionpolicybindings",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "MutatingAdmissionPolicy",
        "mutatingadmissionpolicies",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
    ),
];

/// Namespaced kinds an install puts in namespaces other than its own.
const NAMESPACED_RBAC: &[(&str, &str, &str, &str)] = &[
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
    ),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles"),
];

fn api(client: &Client, kind: &(&str, &str, &str, &str)) -> Api<DynamicObject> {
    let (g, v, k, plural) = *kind;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), plural);
    Api::all_with(client.clone(), &ar)
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// nodegate's objects of a kind, by label; a kind the API server does not
/// serve (404) holds none, and a list that fails is reported and skipped.
async fn labelled(
    api: &Api<DynamicObject>,
    kind: &str,
    left: &mut Vec<Leftover>,
) -> Vec<DynamicObject> {
    let selector = format!("{}={}", plan::PART_OF.0, plan::PART_OF.1);
    match api.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l.items,
        Err(e) if is_status(&e, 404) => Vec::new(),
        Err(e) => {
            left.push(Leftover::Object {
                kind: kind.into(),
                name: "(list)".into(),
                namespace: None,
                why: e.to_string(),
            });
            Vec::new()
        }
    }
}

/// Deletes the cluster-scoped `name`; gone already is done.
async fn delete_named(api: &Api<DynamicObject>, kind: &str, name: &str, left: &mut Vec<Leftover>) {
    delete(api, None, kind, name, &DeleteParams::default(), left).await;
}

/// 1: the admission objects, so nothing re-gates a node from here on.
async fn remove_admission(client: &Client, o: &Options, left: &mut Vec<Leftover>) {
    delete_named(
        &api(client, &CLUSTER_KINDS[0]),
        CLUSTER_KINDS[0].2,
        &o.webhook_config,
        left,
    )
    .await;
    for kind in &CLUSTER_KINDS[1..3] {
        let a = api(client, kind);
        // Not served below Kubernetes 1.36 (or with the API off): nothing to delete.
        for obj in labelled(&a, kind.2, left).await {
            delete_named(&a, kind.2, &obj.name_any(), left).await;
        }
    }
}

/// Deletes a namespaced object; gone already is done.
async fn delete_in<K>(
    api: &Api<K>,
    namespace: &str,
    kind: &str,
    name: &str,
    dp: &DeleteParams,
    left: &mut Vec<Leftover>,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    delete(api, Some(namespace), kind, name, dp, left).await;
}

/// Deletes `name` (in `namespace`, for the report); gone already is done.
async fn delete<K>(
    api: &Api<K>,
    namespace: Option<&str>,
    kind: &str,
    name: &str,
    dp: &DeleteParams,
    left: &mut Vec<Leftover>,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, dp).await {
        Ok(_) => tracing::info!(kind, name, "deleted"),
        Err(e) if is_status(&e, 404) => {}
        Err(e) => left.push(Leftover::Object {
            kind: kind.into(),
            name: name.into(),
            namespace: namespace.map(str::to_owned),
            why: e.to_string(),
        }),
    }
}

/// 2: the certificates controller (it would make its Secrets again) and
/// the agents go, in the foreground; their Pods are waited for after the
/// nodes are opened, so a slow kubelet delays nothing.
async fn delete_workloads(client: &Client, o: &Options, left: &mut Vec<Leftover>) {
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &o.namespace);
    delete_in(
        &deployments,
        &o.namespace,
        "Deployment",
        &o.certs_deployment,
        &dp,
        left,
    )
    .await;
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), &o.namespace);
    delete_in(
        &sets,
        &o.namespace,
        "DaemonSet",
        &o.agent_daemonset,
        &dp,
        left,
    )
    .await;
}

/// The keys of the gates the agent DaemonSet's `--gates` declares (nodegate
/// opens them, so a removal must too), read before the DaemonSet goes. None
/// when it is gone, unreadable or has no `--gates`: the shipped keys stand.
async fn declared_keys(client: &Client, o: &Options) -> Vec<String> {
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), &o.namespace);
    match sets.get_opt(&o.agent_daemonset).await {
        Ok(Some(ds)) => plan::declared_gate_keys(&ds),
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the agent DaemonSet's --gates; removing the shipped gate keys only");
            Vec::new()
        }
    }
}

/// The Pods matching `selector` still there at `deadline` (none: all gone).
async fn pods_left(
    client: &Client,
    o: &Options,
    selector: &str,
    deadline: tokio::time::Instant,
) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &o.namespace);
    loop {
        let running = match pods.list(&ListParams::default().labels(selector)).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, selector, "listing Pods");
                Vec::new()
            }
        };
        if running.is_empty() || tokio::time::Instant::now() >= deadline {
            return running;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// 4: the agents' and the controller's Pods gone; an agent that does not
/// stop (its node down) is reported, not waited for.
async fn wait_workloads(client: &Client, o: &Options, left: &mut Vec<Leftover>) {
    let deadline = tokio::time::Instant::now() + o.agents_timeout;
    for p in pods_left(client, o, &o.agent_selector, deadline).await {
        left.push(Leftover::AgentPod {
            node: p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            pod: p.name_any(),
        });
    }
    let certs = format!("app.kubernetes.io/name={}", o.certs_deployment);
    if !pods_left(client, o, &certs, deadline).await.is_empty() {
        tracing::warn!(
            "the certificates controller's Pod has not stopped; its Secrets may come back"
        );
    }
}

/// 4a: the controller's Secrets and `helm test`'s Pod.
async fn remove_made(client: &Client, o: &Options, left: &mut Vec<Leftover>) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &o.namespace);
    for name in &o.secrets {
        delete_in(
            &secrets,
            &o.namespace,
            "Secret",
            name,
            &DeleteParams::default(),
            left,
        )
        .await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &o.namespace);
    delete_in(
        &pods,
        &o.namespace,
        "Pod",
        &o.test_pod,
        &DeleteParams::default(),
        left,
    )
    .await;
}

/// 3: every gate off every node; a patch that lost a race is tried again.
async fn open_nodes(
    client: &Client,
    o: &Options,
    left: &mut Vec<Leftover>,
) -> anyhow::Result<usize> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut opened = 0;
    for node in nodes
        .list(&ListParams::default())
        .await
        .context("listing Nodes")?
    {
        let name = node.name_any();
        let mut current = node;
        let mut attempt = 0;
        loop {
            let taints = nodegate_shared::node::taints_json(&current);
            let Some(ops) = plan::open_patch(&taints, &o.gate_keys) else {
                break;
            };
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))?;
            match nodes
                .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(node = %name, "opened");
                    opened += 1;
                    break;
                }
                Err(e) if attempt < 5 && !is_status(&e, 403) => {
                    attempt += 1;
                    match nodes.get_opt(&name).await {
                        Ok(Some(n)) => current = n,
                        Ok(None) => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
                Err(e) => {
                    let keys = plan::gate_keys_on(&taints, &o.gate_keys);
                    left.push(Leftover::GatedNode {
                        node: name.clone(),
                        keys,
                        why: e.to_string(),
                    });
                    break;
                }
            }
        }
    }
    Ok(opened)
}

/// 4: without Helm, the rest: cluster-scoped objects by label, the
/// removal's own credential handed to the namespace (the garbage collector
/// deletes it once the namespace is gone), then the namespace.
async fn remove_rest(
    client: &Client,
    o: &Options,
    left: &mut Vec<Leftover>,
) -> anyhow::Result<bool> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let Some(ns) = namespaces.get_opt(&o.namespace).await? else {
        return Ok(false);
    };
    if !plan::deletes(ns.metadata.labels.as_ref(), &o.namespace, &o.own_name) {
        // Helm's install (or a namespace someone else made): Helm deletes
        // its objects after this hook, and the namespace is not ours.
        return Ok(false);
    }
    for kind in &CLUSTER_KINDS[3..] {
        let a = api(client, kind);
        let list = labelled(&a, kind.2, left).await;
        for obj in list {
            if plan::deletes(obj.metadata.labels.as_ref(), &obj.name_any(), &o.own_name) {
                delete_named(&a, kind.2, &obj.name_any(), left).await;
            }
        }
    }
    // Roles of nodegate's identities in other namespaces (the agent's
    // Events in `default`, probe-pod's and the check's in `kube-system`).
    for kind in NAMESPACED_RBAC {
        let (g, v, k, plural) = *kind;
        let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), plural);
        let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let list = labelled(&all, k, left).await;
        for obj in list {
            let ns = obj.namespace().unwrap_or_default();
            if ns == o.namespace
                || !plan::deletes(obj.metadata.labels.as_ref(), &obj.name_any(), &o.own_name)
            {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            delete_in(
                &api,
                &ns,
                k,
                &obj.name_any(),
                &DeleteParams::default(),
                left,
            )
            .await;
        }
    }
    if !left.iter().any(Leftover::is_failure) {
        let owner = json!({"metadata": {"ownerReferences": [{
            "apiVersion": "v1", "kind": "Namespace", "name": o.namespace,
            "uid": ns.metadata.uid.clone().unwrap_or_default(),
        }]}});
        for kind in [&CLUSTER_KINDS[5], &CLUSTER_KINDS[6]] {
            if let Err(e) = api(client, kind)
                .patch(&o.own_name, &PatchParams::default(), &Patch::Merge(&owner))
                .await
            {
                tracing::warn!(kind = kind.2, error = %e, "handing the removal's credential to the namespace");
            }
        }
        namespaces
            .delete(&o.namespace, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting Namespace {}", o.namespace))?;
        tracing::info!(namespace = %o.namespace, "deleting the namespace");
    }
    Ok(true)
}

/// 5: what is still there, after the steps reported their own failures.
async fn verify(client: &Client, o: &Options, left: &mut Vec<Leftover>) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for node in nodes
        .list(&ListParams::default())
        .await
        .context("listing Nodes")?
    {
        let taints = nodegate_shared::node::taints_json(&node);
        let keys = plan::gate_keys_on(&taints, &o.gate_keys);
        let name = node.name_any();
        if !keys.is_empty()
            && !left
                .iter()
                .any(|l| matches!(l, Leftover::GatedNode { node, .. } if *node == name))
        {
            left.push(Leftover::GatedNode {
                node: name,
                keys,
                why: "gated again after it was opened".into(),
            });
        }
    }
    let mwc = api(client, &CLUSTER_KINDS[0]);
    if mwc.get_opt(&o.webhook_config).await?.is_some()
        && !left
            .iter()
            .any(|l| matches!(l, Leftover::Object { name, .. } if *name == o.webhook_config))
    {
        left.push(Leftover::Object {
            kind: CLUSTER_KINDS[0].2.into(),
            name: o.webhook_config.clone(),
            namespace: None,
            why: "still there".into(),
        });
    }
    Ok(())
}

/// Runs the removal; the leftovers, each with its command, are the result
/// (empty: the cluster is as it was).
pub async fn run(client: Client, o: &Options) -> anyhow::Result<Vec<Leftover>> {
    let mut left = Vec::new();
    let declared = declared_keys(&client, o).await;
    let mut o = o.clone();
    for k in declared {
        if !o.gate_keys.contains(&k) {
            tracing::info!(key = %k, "a gate the agent's --gates declares");
            o.gate_keys.push(k);
        }
    }
    let o = &o;
    remove_admission(&client, o, &mut left).await;
    delete_workloads(&client, o, &mut left).await;
    let opened = open_nodes(&client, o, &mut left).await?;
    tracing::info!(opened, "every node's gates removed");
    wait_workloads(&client, o, &mut left).await;
    // Again: an agent of an older release re-gates its node on SIGTERM.
    let again = open_nodes(&client, o, &mut left).await?;
    tracing::info!(again, "gates removed after the agents stopped");
    remove_made(&client, o, &mut left).await;
    verify(&client, o, &mut left).await?;
    // The namespace goes last: this Pod runs in it.
    let whole = remove_rest(&client, o, &mut left).await?;
    tracing::info!(whole_install = whole, "removal done");
    Ok(left)
}
