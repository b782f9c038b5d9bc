//! The Node the confinement attacks aim at.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use serde_json::json;

use super::taints::TAINT_KEY;

/// A node as an admin sees it after a kubelet registered it, with a foreign
/// taint and a cordon, so the attacks have something to remove. It has an
/// annotation from the start, as every real node has (the TTL controller's,
/// added at an unknown moment), so adding one key never replaces the map.
pub async fn node(c: &Cluster, base: &str) -> String {
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
