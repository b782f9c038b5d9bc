//! The removal's decisions, pure: which taints of a Node are nodegate's
//! gates and the guarded patch that removes them, which install objects go,
//! and what a removal that could not finish leaves and how to finish it.

use serde_json::{Value, json};

/// Label every object of an install carries.
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "nodegate");
/// Label Helm puts on what it manages: Helm deletes those itself.
pub const MANAGED_BY_HELM: (&str, &str) = ("app.kubernetes.io/managed-by", "Helm");

/// Indices of the taints whose key is one of nodegate's gate keys (any
/// value or effect: the NoSchedule gate and strict mode's NoExecute boot
/// gate share a key).
pub fn gate_indices(taints: &[Value], keys: &[String]) -> Vec<usize> {
    taints
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            t.get("key")
                .and_then(Value::as_str)
                .is_some_and(|k| keys.iter().any(|g| g == k))
        })
        .map(|(i, _)| i)
        .collect()
}

/// The gate keys a node carries, once each, sorted (the report's).
pub fn gate_keys_on(taints: &[Value], keys: &[String]) -> Vec<String> {
    let found: std::collections::BTreeSet<String> = gate_indices(taints, keys)
        .into_iter()
        .filter_map(|i| taints[i]["key"].as_str().map(str::to_owned))
        .collect();
    found.into_iter().collect()
}

/// The JSON patch removing those taints, each guarded by a `test` of its
/// key (a list changed since it was read fails the patch instead of losing
/// another taint); `None` when the node carries no gate.
pub fn open_patch(taints: &[Value], keys: &[String]) -> Option<Vec<Value>> {
    let found = gate_indices(taints, keys);
    if found.is_empty() {
        return None;
    }
    let mut ops = Vec::new();
    // From the end, so each index still points at the taint it tested.
    for i in found.into_iter().rev() {
        let at = format!("/spec/taints/{i}");
        ops.push(json!({"op": "test", "path": format!("{at}/key"), "value": taints[i]["key"]}));
        ops.push(json!({"op": "remove", "path": at}));
    }
    Some(ops)
}

/// Whether an install object is this removal's to delete: nodegate's, not
/// Helm's (Helm deletes its own after its pre-delete hook), and not the
/// removal's own credential (it needs it until the end).
pub fn deletes(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    name: &str,
    own: &str,
) -> bool {
    let has = |(k, v): (&str, &str)| labels.and_then(|l| l.get(k)).is_some_and(|x| x == v);
    has(PART_OF) && !has(MANAGED_BY_HELM) && name != own
}

/// What a removal leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leftover {
    /// A node still carries a gate (the patch failed: why).
    GatedNode {
        node: String,
        keys: Vec<String>,
        why: String,
    },
    /// An object could not be deleted.
    Object {
        kind: String,
        name: String,
        namespace: Option<String>,
        why: String,
    },
    /// An agent Pod did not stop in time (its node is likely down); it
    /// opens nothing and re-gates nothing once it stops, its DaemonSet gone.
    AgentPod { pod: String, node: String },
}

impl Leftover {
    /// One line for the log, and the command that finishes it.
    pub fn report(&self) -> (String, String) {
        match self {
            Leftover::GatedNode { node, keys, why } => (
                format!("node {node} still carries {} ({why})", keys.join(", ")),
                keys.iter()
                    .map(|k| format!("kubectl taint node {node} {k}-"))
                    .collect::<Vec<_>>()
                    .join(" && "),
            ),
            Leftover::Object {
                kind,
                name,
                namespace,
                why,
            } => (
                format!("{kind} {name} was not deleted ({why})"),
                match namespace {
                    Some(ns) => format!("kubectl -n {ns} delete {} {name}", kind.to_lowercase()),
                    None => format!("kubectl delete {} {name}", kind.to_lowercase()),
                },
            ),
            Leftover::AgentPod { pod, node } => (
                format!("agent Pod {pod} on node {node} has not stopped (is the node down?)"),
                format!("kubectl get node {node}   # once it is back or deleted, the Pod goes"),
            ),
        }
    }

    /// Whether the cluster is left other than it was: a stuck Pod is not,
    /// its DaemonSet and the webhook being gone.
    pub fn is_failure(&self) -> bool {
        !matches!(self, Leftover::AgentPod { .. })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn keys() -> Vec<String> {
        vec![
            "nodegate.dev/agent-not-ready".into(),
            "readiness.k8s.io/nodegate-agent-not-ready".into(),
        ]
    }

    #[test]
    fn every_gate_goes_and_nothing_else() {
        let taints = vec![
            json!({"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"}),
            json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"}),
            json!({"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoExecute"}),
            json!({"key": "readiness.k8s.io/nodegate-agent-not-ready", "effect": "NoSchedule"}),
            json!({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}),
        ];
        assert_eq!(gate_indices(&taints, &keys()), [0, 2, 3]);
        assert_eq!(
            gate_keys_on(&taints, &keys()),
            [
                "nodegate.dev/agent-not-ready",
                "readiness.k8s.io/nodegate-agent-not-ready"
            ]
        );
        let ops = open_patch(&taints, &keys()).unwrap();
        let mut node = json!({"spec": {"taints": taints}});
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone())).unwrap();
        json_patch::patch(&mut node, &patch).unwrap();
        let left: Vec<&str> = node["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(
            left,
            [
                "node.cilium.io/agent-not-ready",
                "node.kubernetes.io/not-ready"
            ]
        );
        // A list that changed meanwhile fails the patch rather than losing a taint.
        let mut moved = json!({"spec": {"taints": [
            {"key": "other", "effect": "NoSchedule"},
            {"key": "nodegate.dev/agent-not-ready", "effect": "NoSchedule"},
        ]}});
        assert!(json_patch::patch(&mut moved, &patch).is_err());
        assert_eq!(open_patch(&[json!({"key": "x"})], &keys()), None);
        assert_eq!(open_patch(&[], &keys()), None);
    }

    #[test]
    fn the_removal_deletes_nodegate_objects_not_helms_nor_its_own() {
        let ours = BTreeMap::from([(
            "app.kubernetes.io/part-of".to_string(),
            "nodegate".to_string(),
        )]);
        let mut helms = ours.clone();
        helms.insert("app.kubernetes.io/managed-by".into(), "Helm".into());
        assert!(deletes(Some(&ours), "nodegate-agent", "nodegate-uninstall"));
        assert!(!deletes(
            Some(&helms),
            "nodegate-agent",
            "nodegate-uninstall"
        ));
        assert!(!deletes(
            Some(&ours),
            "nodegate-uninstall",
            "nodegate-uninstall"
        ));
        assert!(!deletes(None, "nodegate-agent", "nodegate-uninstall"));
    }

    #[test]
    fn each_leftover_names_the_command_that_finishes_it() {
        let gated = Leftover::GatedNode {
            node: "n1".into(),
            keys: vec!["nodegate.dev/agent-not-ready".into()],
            why: "Forbidden".into(),
        };
        let (line, cmd) = gated.report();
        assert!(line.contains("n1") && line.contains("Forbidden"));
        assert_eq!(cmd, "kubectl taint node n1 nodegate.dev/agent-not-ready-");
        let obj = Leftover::Object {
            kind: "MutatingWebhookConfiguration".into(),
            name: "nodegate".into(),
            namespace: None,
            why: "timeout".into(),
        };
        assert_eq!(
            obj.report().1,
            "kubectl delete mutatingwebhookconfiguration nodegate"
        );
        assert!(gated.is_failure() && obj.is_failure());
        assert!(
            !Leftover::AgentPod {
                pod: "p".into(),
                node: "n".into()
            }
            .is_failure()
        );
    }
}
