//! The test's cluster, its Nodes (read, made, their taints and boots) and
//! their Events.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use serde_json::json;

pub const TAINT_KEY: &str = "nodegate.dev/agent-not-ready";

pub fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == "NoSchedule"))
}

pub fn our_taint(n: &Node) -> bool {
    has_taint(n, TAINT_KEY)
}

pub fn ready_boot_id(n: &Node) -> Option<String> {
    n.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("nodegate.dev/ready-boot-id").cloned())
}

pub fn boot_id(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

pub async fn node(api: &Api<Node>, name: &str) -> Node {
    api.get(name).await.unwrap()
}

/// The test's cluster and the admin's view of its Nodes.
pub async fn cluster() -> (Cluster, Api<Node>) {
    let c = Cluster::start().await.unwrap();
    let nodes = Api::all(c.client(users::ADMIN).await.unwrap());
    (c, nodes)
}

/// Node Events (they go to `default`, as the kubelet's do).
pub async fn node_events(c: &Cluster, node: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), "default");
    let mut evs = events.list(&ListParams::default()).await.unwrap().items;
    evs.retain(|e| e.involved_object.name.as_deref() == Some(node));
    evs
}

/// A Node's InternalIP: RFC 2544's benchmarking range (198.18.0.0/15), so a
/// CNI on a real cluster never routes real traffic to a fake node.
pub fn ip(i: usize) -> String {
    format!("198.19.{}.{}", i / 250, i % 250 + 1)
}

/// A fake node's podCIDR, outside every cluster's pod range for the same reason.
pub fn pod_cidr(i: usize) -> String {
    format!("198.18.{}.{}/28", i / 16, (i % 16) * 16)
}

pub fn worker(name: &str, i: usize) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": pod_cidr(i), "providerID": format!("kind://docker/kind/{name}")},
        "status": {"addresses": [{"type": "InternalIP", "address": ip(i)},
                                  {"type": "Hostname", "address": name}],
                   "nodeInfo": {"bootID": format!("boot-{name}")}}
    }))
    .unwrap()
}

pub async fn create(api: &Api<Node>, name: &str, i: usize) -> String {
    api.create(&PostParams::default(), &worker(name, i))
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// Every version of Node `name` from here on, as a watch delivers them, and
/// the task to abort when done.
pub fn record_versions(
    nodes: &Api<Node>,
    name: &str,
) -> (Arc<Mutex<Vec<Node>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::<Node>::new()));
    let versions = seen.clone();
    let watch = tokio::spawn(
        watcher::watch_object(nodes.clone(), name).for_each(move |e| {
            if let Ok(Some(n)) = e {
                versions.lock().unwrap().push(n);
            }
            async {}
        }),
    );
    (seen, watch)
}
