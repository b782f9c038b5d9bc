//! kube-controller-manager's node lifecycle controller, the part that keeps
//! condition taints in step with node conditions: it removes
//! `node.kubernetes.io/not-ready:NoSchedule` once the kubelet reports
//! Ready (the emulator, as TaintNodesByCondition, adds it at create).
//!
//! Upstream (kubernetes/kubernetes):
//! `pkg/controller/nodelifecycle/node_lifecycle_controller.go`
//! `doNoScheduleTaintingPass` and `nodeConditionToTaintKeyStatusMap`;
//! `pkg/util/taints` `TaintSetDiff`; the swap goes through
//! `SwapNodeControllerTaint`, a guarded patch of the whole list — here a
//! JSON patch that tests the list it replaces. The `NoExecute` tainting
//! pass (taint-based eviction) is left out: it only adds taints Karpenter
//! treats as ephemeral or pods tolerate for 300 s.

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{Value, json};

use super::state::node_taints;
use super::taints::{NO_SCHEDULE, taint};

/// `nodeConditionToTaintKeyStatusMap`: (condition, status) → taint key.
const CONDITION_TAINTS: [(&str, &str, &str); 6] = [
    ("Ready", "False", "node.kubernetes.io/not-ready"),
    ("Ready", "Unknown", "node.kubernetes.io/unreachable"),
    (
        "MemoryPressure",
        "True",
        "node.kubernetes.io/memory-pressure",
    ),
    ("DiskPressure", "True", "node.kubernetes.io/disk-pressure"),
    (
        "NetworkUnavailable",
        "True",
        "node.kubernetes.io/network-unavailable",
    ),
    ("PIDPressure", "True", "node.kubernetes.io/pid-pressure"),
];
const UNSCHEDULABLE_KEY: &str = "node.kubernetes.io/unschedulable";

fn managed(t: &Taint) -> bool {
    t.effect == NO_SCHEDULE
        && (t.key == UNSCHEDULABLE_KEY || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == t.key))
}

/// The `NoSchedule` taints the node's conditions call for.
fn wanted(node: &Node) -> Vec<Taint> {
    let mut out: Vec<Taint> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| {
            CONDITION_TAINTS
                .iter()
                .find(|(ty, st, _)| *ty == c.type_ && *st == c.status)
                .map(|(_, _, key)| taint(key, "", NO_SCHEDULE))
        })
        .collect();
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        out.push(taint(UNSCHEDULABLE_KEY, "", NO_SCHEDULE));
    }
    out
}

fn taint_json(t: &Taint) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// `doNoScheduleTaintingPass`: the JSON patch that swaps the condition
/// taints, or `None` when they match.
pub fn no_schedule_tainting_pass(node: &Node) -> Option<Value> {
    let current = node_taints(node);
    let wanted = wanted(node);
    let same = |a: &Taint, b: &Taint| a.key == b.key && a.effect == b.effect;
    let to_add: Vec<&Taint> = wanted
        .iter()
        .filter(|w| !current.iter().any(|c| same(c, w)))
        .collect();
    let stale = |c: &Taint| managed(c) && !wanted.iter().any(|w| same(c, w));
    if to_add.is_empty() && !current.iter().any(stale) {
        return None;
    }
    let new: Vec<Value> = current
        .iter()
        .filter(|c| !stale(c))
        .chain(to_add)
        .map(taint_json)
        .collect();
    let old = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map_or(Value::Null, |ts| {
            Value::Array(ts.iter().map(taint_json).collect())
        });
    Some(json!([
        {"op": "test", "path": "/spec/taints", "value": old},
        {"op": "replace", "path": "/spec/taints", "value": new},
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str, taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap()
    }

    #[test]
    fn ready_removes_not_ready_and_keeps_the_rest() {
        let taints = json!([
            {"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        ]);
        let p = no_schedule_tainting_pass(&node("True", taints.clone())).unwrap();
        assert_eq!(p[0]["value"], taints);
        assert_eq!(p[1]["value"], json!([taints[0]]));
        // Not ready and already tainted: nothing to do.
        assert!(no_schedule_tainting_pass(&node("False", taints)).is_none());
        // Unknown: unreachable instead of not-ready.
        let p = no_schedule_tainting_pass(&node(
            "Unknown",
            json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
        ))
        .unwrap();
        assert_eq!(
            p[1]["value"],
            json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}])
        );
    }
}
