//! The TaintNodesByCondition admission plugin: every new Node starts
//! `node.kubernetes.io/not-ready:NoSchedule`.
//!
//! Follows `plugin/pkg/admission/nodetaint/admission.go` (`Admit`, `addNotReadyTaint`).

use serde_json::{Value, json};

pub const NOT_READY_TAINT_KEY: &str = "node.kubernetes.io/not-ready";

/// TaintNodesByCondition: every new Node starts `not-ready:NoSchedule`.
pub(crate) fn taint_nodes_by_condition(obj: &mut Value) {
    let has = obj
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.get("key").and_then(Value::as_str) == Some(NOT_READY_TAINT_KEY)
                    && t.get("effect").and_then(Value::as_str) == Some("NoSchedule")
            })
        });
    if has {
        return;
    }
    let taint = json!({"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"});
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    match obj["spec"].get_mut("taints").and_then(Value::as_array_mut) {
        Some(list) => list.push(taint),
        None => obj["spec"]["taints"] = json!([taint]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_taint_added_once() {
        let mut n = json!({"metadata": {"name": "n"}});
        taint_nodes_by_condition(&mut n);
        taint_nodes_by_condition(&mut n);
        assert_eq!(
            n["spec"]["taints"],
            json!([{"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}])
        );
    }
}
