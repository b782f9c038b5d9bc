//! Strategic merge patch for the fields of Nodes, Pods and webhook
//! configurations that clients patch.
//!
//! The real server reads merge keys from Go struct tags; here they are a table.
//! Lists without an entry (such as `spec.taints`, which has no merge key) are
//! replaced wholesale — what `kubectl taint` and the node controller rely on.
//!
//! Follows `k8s.io/apimachinery/pkg/util/strategicpatch/patch.go`
//! (`StrategicMergePatch`, `mergeMap`, `mergeSlice`).

use serde_json::{Map, Value};

enum ListStrategy {
    Replace,
    MergeKey(&'static str),
    Union,
}

/// Merge strategy of a list field, by its dotted path from the object root.
fn strategy(path: &str) -> ListStrategy {
    match path {
        "status.conditions" | "status.addresses" => ListStrategy::MergeKey("type"),
        "metadata.ownerReferences" => ListStrategy::MergeKey("uid"),
        "metadata.finalizers" | "spec.podCIDRs" => ListStrategy::Union,
        "spec.containers"
        | "spec.initContainers"
        | "spec.ephemeralContainers"
        | "spec.volumes"
        | "spec.imagePullSecrets"
        | "spec.containers.env"
        | "spec.initContainers.env" => ListStrategy::MergeKey("name"),
        "spec.containers.ports" | "spec.initContainers.ports" => {
            ListStrategy::MergeKey("containerPort")
        }
        "spec.containers.volumeMounts" | "spec.initContainers.volumeMounts" => {
            ListStrategy::MergeKey("mountPath")
        }
        "status.podIPs" | "status.hostIPs" => ListStrategy::MergeKey("ip"),
        // MutatingWebhookConfiguration.Webhooks (`k8s.io/api/admissionregistration/v1/types.go`,
        // `patchMergeKey:"name"`): what `kubectl apply` and `kubectl patch` send.
        "webhooks" => ListStrategy::MergeKey("name"),
        _ => ListStrategy::Replace,
    }
}

/// Applies a strategic merge patch to `target` in place.
pub fn apply(target: &mut Value, patch: &Value) -> Result<(), String> {
    match (target.as_object_mut(), patch) {
        (Some(t), Value::Object(p)) => {
            merge_map(t, p, "");
            Ok(())
        }
        _ => Err("strategic merge patch must be a JSON object".to_string()),
    }
}

fn child(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// A patch value as plain data: directives and nulls dropped.
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|v| v.get("$patch").is_none())
                .map(clean)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn merge_map(target: &mut Map<String, Value>, patch: &Map<String, Value>, path: &str) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        if let Value::Object(m) = clean(&Value::Object(patch.clone())) {
            *target = m;
        }
        return;
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(t)), Value::Array(del)) = (target.get_mut(field), v) {
                t.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            // $setElementOrder/*, $retainKeys (handled below) and unknown directives.
            continue;
        }
        if v.is_null() {
            target.remove(k);
            continue;
        }
        let p = child(path, k);
        match (target.get_mut(k), v) {
            (Some(Value::Object(t)), Value::Object(pm)) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(k);
                } else {
                    merge_map(t, pm, &p);
                }
            }
            (Some(Value::Array(t)), Value::Array(pa)) => merge_list(t, pa, &p),
            (_, Value::Object(pm))
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") =>
            {
                target.remove(k);
            }
            (_, v) => {
                target.insert(k.clone(), clean(v));
            }
        }
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
}

fn merge_list(target: &mut Vec<Value>, patch: &[Value], path: &str) {
    if patch
        .iter()
        .any(|v| v.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *target = patch
            .iter()
            .filter(|v| v.get("$patch").is_none())
            .map(clean)
            .collect();
        return;
    }
    match strategy(path) {
        ListStrategy::Replace => *target = patch.iter().map(clean).collect(),
        ListStrategy::Union => {
            for v in patch {
                if !target.contains(v) {
                    target.push(v.clone());
                }
            }
        }
        ListStrategy::MergeKey(key) => {
            for item in patch {
                let Some(pm) = item.as_object() else {
                    continue;
                };
                let id = pm.get(key);
                let pos = target.iter().position(|t| id.is_some() && t.get(key) == id);
                let delete = pm.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        target.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => {
                        if let Some(t) = target[i].as_object_mut() {
                            merge_map(t, pm, path);
                        }
                    }
                    (None, false) => target.push(clean(item)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn taints_are_replaced_wholesale() {
        let mut node = json!({"spec": {"taints": [
            {"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]}});
        apply(
            &mut node,
            &json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}),
        )
        .unwrap();
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "b", "effect": "NoSchedule"}])
        );
        apply(&mut node, &json!({"spec": {"taints": null}})).unwrap();
        assert_eq!(node["spec"], json!({}));
    }

    #[test]
    fn conditions_merge_by_type_and_directives_are_not_stored() {
        let mut node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}],
            "nodeInfo": {"bootID": "a", "kubeletVersion": "v1.32.0"}}});
        apply(
            &mut node,
            &json!({"status": {
                "$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"bootID": "b"}}}),
        )
        .unwrap();
        assert_eq!(
            node["status"]["conditions"][0],
            json!({"type": "Ready", "status": "True"})
        );
        assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(
            node["status"]["nodeInfo"],
            json!({"bootID": "b", "kubeletVersion": "v1.32.0"})
        );
        assert!(node["status"].get("$setElementOrder/conditions").is_none());
    }

    #[test]
    fn delete_and_replace_directives() {
        let mut v = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}, "spec": {"x": {"y": 1}}});
        apply(
            &mut v,
            &json!({"status": {"conditions": [{"type": "A", "$patch": "delete"}]},
                              "spec": {"x": {"$patch": "replace", "z": 2}}}),
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"status": {"conditions": [{"type": "B"}]}, "spec": {"x": {"z": 2}}})
        );
        assert!(apply(&mut v, &json!([1])).is_err());
    }
}
