//! JSON patches that add nodegate's taints to a Node.
//!
//! The API server fails a request whose patch does not apply, whatever the
//! webhook's failurePolicy, so the shape depends on what the node has:
//! no `spec` → add `/spec`; no `spec.taints` → add the array; otherwise append.

use json_patch::{AddOperation, Patch, PatchOperation, TestOperation};
use jsonptr::PointerBuf;
use serde_json::{Value, json};

use crate::node::NodeView;
use crate::taint::TaintSpec;

/// Whether the patch carries a `test` guard (for writes outside admission,
/// where the node may have changed since it was read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Admission patches apply to the exact object under review.
    None,
    /// `test` the resourceVersion that was read, and the taint list itself, so
    /// any write since the read fails the patch and the caller re-reads. The
    /// taint list alone is not enough: it can go back to what was read (ABA)
    /// while the agent records that the node is ready on its current boot.
    Current,
}

/// A patch that adds `missing` to `node`; empty when nothing is missing.
pub fn add_taints(node: &NodeView, missing: &[&TaintSpec], guard: Guard) -> Patch {
    let mut ops = Vec::with_capacity(missing.len() + 1);
    if missing.is_empty() {
        return Patch(ops);
    }
    let taints_present = node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some();
    if guard == Guard::Current {
        if let Some(rv) = &node.metadata.resource_version {
            ops.push(PatchOperation::Test(TestOperation {
                path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
                value: Value::String(rv.clone()),
            }));
        }
        if taints_present {
            ops.push(PatchOperation::Test(TestOperation {
                path: PointerBuf::from_tokens(["spec", "taints"]),
                value: Value::Array(node.taints().to_vec()),
            }));
        }
    }
    let values: Vec<Value> = missing.iter().map(|t| t.to_json()).collect();
    if taints_present {
        // At the front: the taints others add at create (the API server's
        // `node.kubernetes.io/not-ready`, a kubelet's
        // `--register-with-taints`) come after ours, so their removal when
        // the node turns ready never moves ours, and the agent's ready
        // patch, which `test`s ours at its index, does not fail on it. Each
        // one at 0, as the admission policy's CEL can (it has no index):
        // several of ours land in reverse order, the same either way.
        for value in values {
            ops.push(PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["spec", "taints", "0"]),
                value,
            }));
        }
    } else if node.has_spec() {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["spec", "taints"]),
            value: Value::Array(values),
        }));
    } else {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["spec"]),
            value: json!({ "taints": values }),
        }));
    }
    Patch(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<TaintSpec> {
        vec![
            "node.cilium.io/agent-not-ready=true:NoSchedule"
                .parse()
                .unwrap(),
            "example.com/gate:NoExecute".parse().unwrap(),
        ]
    }

    fn apply(node: &Value, patch: &Patch) -> Result<Value, json_patch::PatchError> {
        let mut doc = node.clone();
        json_patch::patch(&mut doc, patch)?;
        Ok(doc)
    }

    fn check(node: Value, guard: Guard) -> Value {
        let view: NodeView = serde_json::from_value(node.clone()).unwrap();
        let specs = specs();
        let patch = add_taints(&view, &view.missing(&specs), guard);
        let out = apply(&node, &patch).unwrap();
        let after: NodeView = serde_json::from_value(out.clone()).unwrap();
        assert!(after.missing(&specs).is_empty(), "{out}");
        out
    }

    #[test]
    fn adds_spec_when_absent() {
        let out = check(json!({"metadata": {"name": "n"}}), Guard::None);
        assert_eq!(out["spec"]["taints"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn adds_array_when_taints_absent() {
        let out = check(
            json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24"}}),
            Guard::None,
        );
        assert_eq!(out["spec"]["podCIDR"], "10.0.0.0/24");
        assert_eq!(out["spec"]["taints"].as_array().unwrap().len(), 2);
    }

    /// Ours go first (last configured first), and the others keep their
    /// order: removing an earlier writer's taint then never moves ours.
    #[test]
    fn goes_first_keeping_others_in_order() {
        let other = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
        let later = json!({"key": "example.com/registered", "effect": "NoSchedule"});
        let out = check(
            json!({"spec": {"taints": [other.clone(), later.clone()]}}),
            Guard::None,
        );
        let taints = out["spec"]["taints"].as_array().unwrap();
        let ours: Vec<Value> = specs().iter().rev().map(|t| t.to_json()).collect();
        assert_eq!(taints[..2], ours[..]);
        assert_eq!(taints[2..], [other, later]);
    }

    #[test]
    fn nothing_missing_means_empty_patch() {
        let node =
            json!({"spec": {"taints": specs().iter().map(|t| t.to_json()).collect::<Vec<_>>()}});
        let view: NodeView = serde_json::from_value(node).unwrap();
        let specs = specs();
        assert!(
            add_taints(&view, &view.missing(&specs), Guard::Current)
                .0
                .is_empty()
        );
    }

    #[test]
    fn guard_fails_when_taints_changed_meanwhile() {
        let read = json!({"metadata": {"resourceVersion": "5"},
                          "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}});
        let view: NodeView = serde_json::from_value(read).unwrap();
        let specs = specs();
        let patch = add_taints(&view, &view.missing(&specs), Guard::Current);
        let now = json!({"metadata": {"resourceVersion": "6"},
                         "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}});
        assert!(apply(&now, &patch).is_err());
        let unchanged = json!({"metadata": {"resourceVersion": "5"},
                               "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}});
        assert!(apply(&unchanged, &patch).is_ok());
    }

    #[test]
    fn guard_fails_when_taints_went_back_to_what_was_read() {
        // Read: rebooted node, only the not-ready taint. Meanwhile our taint
        // landed and the agent removed it again, recording the new boot: the
        // list is what was read, but the node is now ready on this boot.
        let taints = json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]);
        let read = json!({"metadata": {"resourceVersion": "5"}, "spec": {"taints": taints}});
        let view: NodeView = serde_json::from_value(read).unwrap();
        let specs = specs();
        let patch = add_taints(&view, &view.missing(&specs), Guard::Current);
        let now = json!({"metadata": {"resourceVersion": "9",
                                      "annotations": {"nodegate.dev/ready-boot-id": "b2"}},
                         "spec": {"taints": taints}});
        assert!(apply(&now, &patch).is_err());
    }

    #[test]
    fn guard_uses_resource_version_without_taints() {
        let view: NodeView =
            serde_json::from_value(json!({"metadata": {"resourceVersion": "5"}, "spec": {}}))
                .unwrap();
        let specs = specs();
        let patch = add_taints(&view, &view.missing(&specs), Guard::Current);
        let moved = json!({"metadata": {"resourceVersion": "6"}, "spec": {}});
        assert!(apply(&moved, &patch).is_err());
        let same = json!({"metadata": {"resourceVersion": "5"}, "spec": {}});
        assert!(apply(&same, &patch).is_ok());
    }
}
