//! What a Node or a Pod says, as the scenarios ask it.

use k8s_openapi::api::core::v1::{Node, Pod};
/// A Node's taints as JSON (the shared helper every crate uses).
pub use nodegate_shared::node::taints_json;

/// nodegate's gate (NoSchedule; NoExecute is strict mode's boot gate).
pub const GATE: &str = "nodegate.dev/agent-not-ready";
/// The install's namespace.
pub const NS: &str = "nodegate";

/// nodegate's gate: `GATE:NoSchedule`.
pub fn gated(n: &Node) -> bool {
    taints(n)
        .iter()
        .any(|(k, e)| k == GATE && e == "NoSchedule")
}

/// Gated by any NoSchedule gate nodegate ships (each key profile's): what
/// a canary answered during a switch of key profile carries, from an old
/// replica or a new one.
pub fn gated_by_a_shipped_gate(n: &Node) -> bool {
    let shipped = nodegate_shared::taint::shipped_gates();
    taints(n).iter().any(|(k, e)| {
        e == "NoSchedule"
            && shipped
                .iter()
                .any(|g| g.key() == k && g.effect().as_str() == e)
    })
}

/// Strict mode's boot gate: `GATE:NoExecute`.
pub fn boot_gated(n: &Node) -> bool {
    taints(n).iter().any(|(k, e)| k == GATE && e == "NoExecute")
}

/// Not schedulable anyway: the node lifecycle controller's taint for a node
/// that is not Ready (`node.kubernetes.io/unreachable` or `not-ready`,
/// NoSchedule) is still on.
pub fn held_by_node_lifecycle(n: &Node) -> bool {
    taints(n).iter().any(|(k, e)| {
        (k == "node.kubernetes.io/unreachable" || k == "node.kubernetes.io/not-ready")
            && e == "NoSchedule"
    })
}

/// (key, effect) of each taint.
pub fn taints(n: &Node) -> Vec<(String, String)> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

pub fn boot_id(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.boot_id.clone())
        .filter(|b| !b.is_empty())
}

pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn ns_of(p: &Pod) -> &str {
    p.metadata.namespace.as_deref().unwrap_or_default()
}

pub fn name_of(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

pub fn uid_of(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or_default()
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}
