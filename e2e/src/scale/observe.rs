//! What the scenarios assert, from the one observer ([`crate::observe`])
//! with a slim projection: of each Node version whether it carries the
//! gate and its boot ID; of each bound Pod its node and whether it
//! tolerates the gate. A pod bound while its node was gated is one whose
//! first bound version falls after a gated version of the node and before
//! the next ungated one.

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::observe::{Observer, Projection, Seen, Watches};
use crate::real_nodes::objects::{GATE, boot_id, gated};

/// What the scale harness keeps of a Node version.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub gated: bool,
    pub boot_id: String,
}

impl Projection<Node> for NodeState {
    fn project(node: &Node) -> Option<Self> {
        Some(NodeState {
            gated: gated(node),
            boot_id: boot_id(node).unwrap_or_default(),
        })
    }
}

/// What the scale harness keeps of a bound Pod's version.
#[derive(Debug, Clone)]
pub struct Binding {
    pub node: String,
    /// The pod tolerates the gate (the agent's and the network agent's
    /// DaemonSet Pods tolerate every taint): its binding to a gated node is
    /// what the gate allows.
    pub tolerates_gate: bool,
}

impl Projection<Pod> for Binding {
    fn project(pod: &Pod) -> Option<Self> {
        Some(Binding {
            node: pod.spec.as_ref()?.node_name.clone()?,
            tolerates_gate: tolerates_gate(pod),
        })
    }
}

pub type NodeVersion = Seen<NodeState>;
pub type Shared = Observer<NodeState, Binding>;
pub type Record = crate::observe::Record<NodeState, Binding>;

/// The observer of every Node and every bound Pod.
pub fn start(admin: kube::Config) -> anyhow::Result<Shared> {
    Observer::start(
        admin,
        Watches {
            pod_fields: Some("spec.nodeName!=".into()),
        },
    )
}

/// When the watch delivered `v`, on the harness's clock.
pub fn seen(v: &NodeVersion) -> tokio::time::Instant {
    tokio::time::Instant::from_std(v.at)
}

/// Was `node` gated at revision `at` (its latest version at or before it)?
pub fn gated_at(versions: &[NodeVersion], at: u64) -> bool {
    versions
        .iter()
        .rev()
        .find(|v| v.rv <= at)
        .is_some_and(|v| v.obj.gated)
}

/// Does `pod` tolerate the gate's NoSchedule taint (as the scheduler's
/// `TaintToleration` plugin matches a toleration to a taint)?
pub fn tolerates_gate(pod: &Pod) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations.is_some_and(|ts| {
        ts.iter().any(|t| {
            let key = t.key.as_deref().unwrap_or("");
            let exists = t.operator.as_deref() == Some("Exists");
            let effect = t.effect.as_deref().unwrap_or("");
            let key_ok = if key.is_empty() { exists } else { key == GATE };
            let value_ok = exists || t.value.as_deref() == Some("true");
            key_ok && value_ok && (effect.is_empty() || effect == "NoSchedule")
        })
    })
}

/// Pods that do not tolerate the gate bound to a node while it was gated.
pub fn bound_while_gated(rec: &Record, since_rv: u64) -> Vec<String> {
    rec.pods
        .iter()
        .filter_map(|(uid, vs)| Some((uid, vs.first()?)))
        .filter(|(_, b)| b.rv > since_rv && !b.obj.tolerates_gate)
        .filter(|(_, b)| {
            rec.nodes
                .get(&b.obj.node)
                .is_some_and(|vs| gated_at(vs, b.rv))
        })
        .map(|(uid, b)| format!("{uid} on {}", b.obj.node))
        .collect()
}

/// Nearest-rank percentile of `v` (sorted here), `q` in 0..=1.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(tolerations: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "tolerations": tolerations},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_toleration_of_the_gate_lets_a_pod_onto_a_gated_node() {
        let cases = [
            (serde_json::json!([{"operator": "Exists"}]), true),
            (
                serde_json::json!([{"key": GATE, "operator": "Exists"}]),
                true,
            ),
            (
                serde_json::json!([{"key": GATE, "value": "true", "effect": "NoSchedule"}]),
                true,
            ),
            (serde_json::json!([{"key": GATE, "value": "false"}]), false),
            (
                serde_json::json!([{"key": GATE, "operator": "Exists", "effect": "NoExecute"}]),
                false,
            ),
            (
                serde_json::json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]),
                false,
            ),
            (serde_json::json!([]), false),
        ];
        for (t, want) in cases {
            assert_eq!(tolerates_gate(&pod(t.clone())), want, "{t}");
        }
    }

    fn seen<T>(rv: u64, obj: T) -> Seen<T> {
        Seen {
            at: std::time::Instant::now(),
            rv,
            deleted: false,
            obj,
        }
    }

    fn state(gated: bool) -> NodeState {
        NodeState {
            gated,
            boot_id: String::new(),
        }
    }

    #[test]
    fn a_pod_counts_as_bound_while_gated_by_its_first_bound_version() {
        let mut rec = Record::default();
        // n1 gated from 10 to 20, ungated after.
        rec.nodes.insert(
            "n1".into(),
            vec![seen(10, state(true)), seen(20, state(false))],
        );
        let bound = |node: &str, tolerates_gate: bool| Binding {
            node: node.into(),
            tolerates_gate,
        };
        // Bound at 15 (gated), later versions after 20 change nothing.
        rec.pods.insert(
            "early".into(),
            vec![seen(15, bound("n1", false)), seen(25, bound("n1", false))],
        );
        // Tolerates the gate: the agent's and the network agent's pods.
        rec.pods
            .insert("daemon".into(), vec![seen(12, bound("n1", true))]);
        rec.pods
            .insert("late".into(), vec![seen(21, bound("n1", false))]);
        assert_eq!(bound_while_gated(&rec, 0), ["early on n1"]);
        // Only bindings after `since_rv` count.
        assert!(bound_while_gated(&rec, 15).is_empty());
        assert!(gated_at(&rec.nodes["n1"], 19));
        assert!(!gated_at(&rec.nodes["n1"], 9));
    }
}
