//! The removal's decisions, pure: which taints of a Node are nodegate's
//! gates and the guarded patch that removes them, which install objects go,
//! and what a removal that could not finish leaves and how to finish it.

use serde_json::{Value, json};

/// Label every object of an install carries.
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "nodegate");
/// Label Helm puts on what it manages: Helm deletes those itself.
pub const MANAGED_BY_HELM: (&str, &str) = ("app.kubernetes.io/managed-by", "Helm");

/// The keys of the gates nodegate opens (and strict mode's boot gates) that
/// the agent DaemonSet's `--gates` declares, in its args (`--gates=…` or
/// `--gates …`, the last one as clap reads it) or its `NODEGATE_GATES`
/// env. Gates owned elsewhere are left out: their owner removes them, with
/// or without nodegate. An unreadable declaration yields none (the
/// agent would not have started with it either).
pub fn declared_gate_keys(ds: &k8s_openapi::api::apps::v1::DaemonSet) -> Vec<String> {
    let containers = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers.as_slice())
        .unwrap_or_default();
    let mut text = None;
    for c in containers {
        let args = c.args.as_deref().unwrap_or_default();
        let mut from_args = None;
        for (i, a) in args.iter().enumerate() {
            if let Some(v) = a.strip_prefix("--gates=") {
                from_args = Some(v.to_owned());
            } else if a == "--gates" {
                from_args = args.get(i + 1).cloned();
            }
        }
        let from_env = c
            .env
            .as_deref()
            .unwrap_or_default()
            .iter()
            .rev()
            .find(|e| e.name == "NODEGATE_GATES")
            .and_then(|e| e.value.clone());
        text = text.or(from_args).or(from_env);
    }
    let Some(gates) = text.and_then(|t| nodegate_shared::gates::Gates::parse(&t).ok()) else {
        return Vec::new();
    };
    let mut keys: Vec<String> = Vec::new();
    for t in gates.taints().into_iter().chain(gates.boot_taints()) {
        if !keys.iter().any(|k| k == t.key()) {
            keys.push(t.key().to_owned());
        }
    }
    keys
}

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
    #[test]
    fn a_removal_also_opens_the_gates_the_agent_declares_and_leaves_owned_ones() {
        let gates = r#"{"gates":[{"name":"cni","taint":"nodegate.dev/agent-not-ready=true:NoSchedule","probes":{"tcp":["h:1"]}},{"name":"csi","taint":"nodegate.dev/csi-not-ready=true:NoSchedule","probes":{"tcp":["h:2"]}},{"name":"ebs","taint":"ebs.csi.aws.com/agent-not-ready:NoExecute","owner":{"daemonSet":"kube-system/ebs-csi-node"}}],"bootTaints":["nodegate.dev/agent-not-ready=true:NoExecute"]}"#;
        let ds = |args: Value, env: Value| -> k8s_openapi::api::apps::v1::DaemonSet {
            serde_json::from_value(
                json!({"spec": {"selector": {}, "template": {"spec": {"containers": [
                    {"name": "agent", "args": args, "env": env}
                ]}}}}),
            )
            .unwrap()
        };
        let want = ["nodegate.dev/agent-not-ready", "nodegate.dev/csi-not-ready"];
        let with_arg = ds(
            json!([format!("--gates={gates}"), "--probe-period=2s"]),
            json!([]),
        );
        assert_eq!(declared_gate_keys(&with_arg), want);
        let split = ds(json!(["--gates", gates]), json!([]));
        assert_eq!(declared_gate_keys(&split), want);
        let in_env = ds(
            json!([]),
            json!([{"name": "NODEGATE_GATES", "value": gates}]),
        );
        assert_eq!(declared_gate_keys(&in_env), want);
        assert!(
            declared_gate_keys(&ds(json!(["--taint=a.dev/x:NoSchedule"]), json!([]))).is_empty()
        );
        assert!(declared_gate_keys(&ds(json!(["--gates={not json"]), json!([]))).is_empty());
    }

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
