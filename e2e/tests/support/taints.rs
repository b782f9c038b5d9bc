//! nodegate's taint on a Node, as the suites look for it.

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;

/// The key of the default taint, spelled out so a change of
/// `nodegate_shared::keys::DEFAULT_TAINT` shows (`default_taint_is_what_the_webhook_adds`).
pub const TAINT_KEY: &str = "nodegate.dev/agent-not-ready";

pub fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

pub fn has_taint(n: &Node) -> bool {
    taint_keys(n).iter().any(|k| k == TAINT_KEY)
}

/// The stored node's taints as `key:effect`, but the lifecycle ones
/// (`node.kubernetes.io/*`, which the API server and its controllers add
/// and remove).
pub async fn taints(c: &Cluster, node: &str) -> Vec<String> {
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
