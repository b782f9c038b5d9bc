//! Karpenter's NodeClaim lifecycle on the Node: registration and
//! initialization, as the patches they send.
//!
//! Upstream (`pkg/controllers/nodeclaim/lifecycle/`): `registration.go`
//! `Registration.Reconcile` (once per NodeClaim: `syncNode`, drop
//! `karpenter.sh/unregistered`, label `karpenter.sh/registered=true`, a
//! merge patch with an optimistic lock — a conflict requeues) and
//! `syncNode` (termination finalizer; the NodeClaim's `taints` then
//! `startupTaints` merged in by key and effect unless the Node is labelled
//! `karpenter.sh/do-not-sync-taints=true`; its annotations and labels);
//! `initialization.go` `Initialization.Reconcile` (registered, Node Ready,
//! `StartupTaintsRemoved`, `KnownEphemeralTaintsRemoved`, then the label
//! `karpenter.sh/initialized=true` by merge patch; taints neither declared
//! nor known ephemeral are not looked at). `utils/nodeclaim`
//! `NodeForNodeClaim` finds the Node by `spec.providerID`.

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{Map, Value, json};

use super::nodeclaim::NodeClaim;
use super::state::{INITIALIZED_LABEL, REGISTERED_LABEL, node_taints};
use super::taints::{is_known_ephemeral_taint, match_taint, merge, unregistered};
use super::version::Version;

pub const DO_NOT_SYNC_TAINTS_LABEL: &str = "karpenter.sh/do-not-sync-taints";
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";

/// `NodeForNodeClaim`: the Node with the NodeClaim's providerID.
pub fn node_for_claim<'a>(
    claim: &NodeClaim,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Option<&'a Node> {
    nodes.into_iter().find(|n| {
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(claim.provider_id.as_str())
    })
}

/// `syncNode`, on a copy.
pub fn sync_node(claim: &NodeClaim, node: &Node) -> Node {
    let mut n = node.clone();
    let finalizers = n.metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
        finalizers.push(TERMINATION_FINALIZER.to_string());
    }
    let labels = n.metadata.labels.get_or_insert_with(Default::default);
    if labels.get(DO_NOT_SYNC_TAINTS_LABEL).map(String::as_str) != Some("true") {
        let merged = merge(
            &merge(node_taints(node), &claim.taints),
            &claim.startup_taints,
        );
        n.spec.get_or_insert_with(Default::default).taints = Some(merged);
    }
    // lo.Assign of two empty maps is empty, and an empty map is omitted.
    let mut annotations = n.metadata.annotations.take().unwrap_or_default();
    annotations.extend(claim.annotations.clone());
    n.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    let labels = n.metadata.labels.get_or_insert_with(Default::default);
    labels.extend(claim.labels.clone());
    n
}

/// What registration stores: the synced Node without the unregistered
/// taint, labelled registered.
pub fn register(claim: &NodeClaim, node: &Node) -> Node {
    let mut n = sync_node(claim, node);
    let spec = n.spec.get_or_insert_with(Default::default);
    let kept: Vec<Taint> = spec
        .taints
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !match_taint(t, &unregistered()))
        .collect();
    spec.taints = Some(kept);
    n.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(REGISTERED_LABEL.to_string(), "true".to_string());
    n
}

/// Registration's patch (`MergeFromWithOptimisticLock`): the merge patch
/// from `stored` to `updated` with `stored`'s resourceVersion, so a Node
/// that moved on is a 409; `None` when nothing changes.
pub fn registration_patch(stored: &Node, updated: &Node) -> serde_json::Result<Option<Value>> {
    let mut patch = merge_patch(
        &serde_json::to_value(stored)?,
        &serde_json::to_value(updated)?,
    );
    if patch.is_null() {
        return Ok(None);
    }
    patch["metadata"]["resourceVersion"] = json!(stored.metadata.resource_version);
    Ok(Some(patch))
}

/// Why initialization waits (the `Initialized` condition's reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    NotRegistered,
    NodeNotReady,
    StartupTaintsExist(String),
    KnownEphemeralTaintsExist(String),
}

/// The Node's `Ready` condition status.
pub fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str())
}

/// `Initialization.Reconcile`'s checks (resources and DRA drivers left
/// out): `Ok` when the Node is to be labelled initialized.
pub fn initialization(claim: &NodeClaim, node: &Node, v: Version) -> Result<(), Waiting> {
    if !claim.registered {
        return Err(Waiting::NotRegistered);
    }
    if ready_status(node) != Some("True") {
        return Err(Waiting::NodeNotReady);
    }
    let taints = node_taints(node);
    // StartupTaintsRemoved
    if let Some(t) = claim
        .startup_taints
        .iter()
        .find_map(|s| taints.iter().find(|t| match_taint(s, t)))
    {
        return Err(Waiting::StartupTaintsExist(t.key.clone()));
    }
    // KnownEphemeralTaintsRemoved
    if let Some(t) = taints.iter().find(|t| is_known_ephemeral_taint(t, v)) {
        return Err(Waiting::KnownEphemeralTaintsExist(t.key.clone()));
    }
    Ok(())
}

/// Initialization's patch (`MergeFrom`, no lock).
pub fn initialization_patch() -> Value {
    json!({"metadata": {"labels": {INITIALIZED_LABEL: "true"}}})
}

/// The JSON merge patch (RFC 7386) that turns `from` into `to`, as
/// controller-runtime's `MergeFrom` computes it; `null` when equal.
pub fn merge_patch(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut out = Map::new();
            for (k, tv) in t {
                let d = match f.get(k) {
                    Some(fv) if fv == tv => continue,
                    Some(fv) => merge_patch(fv, tv),
                    None => tv.clone(),
                };
                out.insert(k.clone(), d);
            }
            for k in f.keys().filter(|k| !t.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            if out.is_empty() {
                Value::Null
            } else {
                Value::Object(out)
            }
        }
        _ if from == to => Value::Null,
        _ => to.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::karpenter::nodepool::NodePool;
    use crate::karpenter::taints::{NOT_READY_KEY, UNREGISTERED_KEY};

    const GATE: &str = "nodegate.dev/agent-not-ready";

    fn claim(startup: &str) -> NodeClaim {
        let np = NodePool::from_yaml(&format!(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: default}}\n\
             spec:\n  template:\n    metadata: {{labels: {{team: web}}}}\n    spec:\n      startupTaints: {startup}\n"
        ))
        .unwrap();
        NodeClaim::from_nodepool(&np, "default-001", "p://1", 10)
    }

    fn node(taints: Value, ready: &str, labels: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "default-001", "resourceVersion": "7", "labels": labels},
            "spec": {"providerID": "p://1", "taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap()
    }

    fn keys(n: &Node) -> Vec<&str> {
        node_taints(n).iter().map(|t| t.key.as_str()).collect()
    }

    #[test]
    fn registration_syncs_startup_taints_and_drops_unregistered() {
        let c = claim("[{key: node.cilium.io/agent-not-ready, value: 'true', effect: NoExecute}]");
        let stored = node(
            json!([
                {"key": GATE, "value": "true", "effect": "NoSchedule"},
                {"key": NOT_READY_KEY, "effect": "NoSchedule"},
                {"key": UNREGISTERED_KEY, "effect": "NoExecute"},
            ]),
            "False",
            json!({"kubernetes.io/hostname": "default-001"}),
        );
        assert_eq!(node_for_claim(&c, [&stored]), Some(&stored));
        let updated = register(&c, &stored);
        assert_eq!(
            keys(&updated),
            [GATE, NOT_READY_KEY, "node.cilium.io/agent-not-ready"]
        );
        let patch = registration_patch(&stored, &updated).unwrap().unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["metadata"]["labels"][REGISTERED_LABEL], "true");
        assert_eq!(
            patch["metadata"]["labels"]["karpenter.sh/nodepool"],
            "default"
        );
        assert_eq!(
            patch["metadata"]["finalizers"],
            json!([TERMINATION_FINALIZER])
        );
        assert_eq!(patch["spec"]["taints"].as_array().unwrap().len(), 3);
        assert!(patch.get("status").is_none());
        // Registered once: the same sync changes nothing more.
        assert_eq!(
            registration_patch(&updated, &register(&c, &updated)).unwrap(),
            None
        );

        // Taints not synced: only the unregistered taint goes.
        let mut own = stored.clone();
        own.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(DO_NOT_SYNC_TAINTS_LABEL.into(), "true".into());
        assert_eq!(keys(&register(&c, &own)), [GATE, NOT_READY_KEY]);
    }

    #[test]
    fn initialization_ignores_undeclared_taints() {
        let gated = json!([{"key": GATE, "value": "true", "effect": "NoSchedule"}]);
        let mut undeclared = claim("[]");
        let mut declared = claim(&format!("[{{key: {GATE}, effect: NoSchedule}}]"));
        assert_eq!(
            initialization(
                &undeclared,
                &node(gated.clone(), "True", json!({})),
                Version::READ
            ),
            Err(Waiting::NotRegistered)
        );
        undeclared.registered = true;
        declared.registered = true;
        let v = Version::READ;
        assert_eq!(
            initialization(&undeclared, &node(gated.clone(), "False", json!({})), v),
            Err(Waiting::NodeNotReady)
        );
        // Ready and gated: initialized, the gate is not Karpenter's business.
        assert_eq!(
            initialization(&undeclared, &node(gated.clone(), "True", json!({})), v),
            Ok(())
        );
        assert_eq!(
            initialization(&declared, &node(gated, "True", json!({})), v),
            Err(Waiting::StartupTaintsExist(GATE.into()))
        );
        let not_ready = json!([{"key": NOT_READY_KEY, "effect": "NoSchedule"}]);
        assert_eq!(
            initialization(&declared, &node(not_ready, "True", json!({})), v),
            Err(Waiting::KnownEphemeralTaintsExist(NOT_READY_KEY.into()))
        );
        let readiness = json!([{"key": "readiness.k8s.io/net", "effect": "NoSchedule"}]);
        assert!(
            initialization(&undeclared, &node(readiness.clone(), "True", json!({})), v).is_err()
        );
        assert!(
            initialization(
                &undeclared,
                &node(readiness, "True", json!({})),
                Version::new(1, 12, 0)
            )
            .is_ok()
        );
    }

    #[test]
    fn merge_patch_is_rfc_7386() {
        let from = json!({"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2], "gone": true});
        let to = json!({"a": 1, "b": {"c": 2, "d": 4}, "l": [1], "new": "x"});
        assert_eq!(
            merge_patch(&from, &to),
            json!({"b": {"d": 4}, "l": [1], "new": "x", "gone": null})
        );
        assert_eq!(merge_patch(&from, &from), Value::Null);
    }
}
