//! What the scenarios assert, from the one observer ([`crate::observe`])
//! with a slim projection: of each Node version which of nodegate's gates
//! ([`super::gates::GATES`]) it carries and its boot ID; of each bound Pod
//! its node and which gates it tolerates. A pod bound while its node was
//! gated is one whose first bound version falls after a version of the node
//! carrying a gate the pod does not tolerate and before the next version
//! without it. With one gate (the shipped install) the others never appear.

use k8s_openapi::api::core::v1::{Node, Pod};

use super::gates;
use crate::observe::{Observer, Projection, Seen, Watches};
use crate::real_nodes::objects::boot_id;

/// What the scale harness keeps of a Node version.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// It carries one of nodegate's gates or more.
    pub gated: bool,
    /// Which: bit `k` for gate `k` of [`gates::GATES`].
    pub gates: u8,
    pub boot_id: String,
}

impl NodeState {
    pub fn new(gates: u8, boot_id: String) -> Self {
        Self {
            gated: gates != 0,
            gates,
            boot_id,
        }
    }
}

impl Projection<Node> for NodeState {
    fn project(node: &Node) -> Option<Self> {
        Some(NodeState::new(
            gate_bits(node),
            boot_id(node).unwrap_or_default(),
        ))
    }
}

/// The gates `node` carries (each `key:NoSchedule`), one bit each.
pub fn gate_bits(node: &Node) -> u8 {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    let mut bits = 0;
    for (k, key) in gates::keys(gates::MAX).into_iter().enumerate() {
        if taints.is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == "NoSchedule")) {
            bits |= 1 << k;
        }
    }
    bits
}

/// What the scale harness keeps of a bound Pod's version.
#[derive(Debug, Clone)]
pub struct Binding {
    pub node: String,
    /// The gates the pod tolerates, one bit each (the agent's and the
    /// network agent's DaemonSet Pods tolerate every taint): its binding to
    /// a node held by those only is what the gates allow.
    pub tolerated: u8,
}

impl Projection<Pod> for Binding {
    fn project(pod: &Pod) -> Option<Self> {
        Some(Binding {
            node: pod.spec.as_ref()?.node_name.clone()?,
            tolerated: tolerated(pod),
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

/// The gates `node` carried at revision `at` (its latest version at or
/// before it).
pub fn gates_at(versions: &[NodeVersion], at: u64) -> u8 {
    versions
        .iter()
        .rev()
        .find(|v| v.rv <= at)
        .map_or(0, |v| v.obj.gates)
}

/// Was `node` gated at revision `at`?
pub fn gated_at(versions: &[NodeVersion], at: u64) -> bool {
    gates_at(versions, at) != 0
}

/// Does `pod` tolerate the gate's NoSchedule taint (as the scheduler's
/// `TaintToleration` plugin matches a toleration to a taint)?
pub fn tolerates_gate(pod: &Pod) -> bool {
    tolerated(pod) & 1 != 0
}

/// The gates whose NoSchedule taint (`key=true`) `pod` tolerates, one bit
/// each, as the scheduler's `TaintToleration` plugin matches a toleration
/// to a taint.
pub fn tolerated(pod: &Pod) -> u8 {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    let mut bits = 0;
    for (k, gate) in gates::keys(gates::MAX).into_iter().enumerate() {
        let ok = tolerations.is_some_and(|ts| {
            ts.iter().any(|t| {
                let key = t.key.as_deref().unwrap_or("");
                let exists = t.operator.as_deref() == Some("Exists");
                let effect = t.effect.as_deref().unwrap_or("");
                let key_ok = if key.is_empty() { exists } else { key == gate };
                let value_ok = exists || t.value.as_deref() == Some("true");
                key_ok && value_ok && (effect.is_empty() || effect == "NoSchedule")
            })
        });
        if ok {
            bits |= 1 << k;
        }
    }
    bits
}

/// Pods bound to a node while it carried a gate they do not tolerate.
pub fn bound_while_gated(rec: &Record, since_rv: u64) -> Vec<String> {
    rec.pods
        .iter()
        .filter_map(|(uid, vs)| Some((uid, vs.first()?)))
        .filter(|(_, b)| b.rv > since_rv)
        .filter(|(_, b)| {
            rec.nodes
                .get(&b.obj.node)
                .is_some_and(|vs| gates_at(vs, b.rv) & !b.obj.tolerated != 0)
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
        const GATE: &str = crate::real_nodes::objects::GATE;
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
        NodeState::new(u8::from(gated), String::new())
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
            tolerated: if tolerates_gate { 0b111 } else { 0 },
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

    /// With several gates a pod must tolerate each gate its node carries:
    /// one that tolerates the first gate only is bound while gated on a node
    /// the second still holds.
    #[test]
    fn a_pod_must_tolerate_every_gate_its_node_still_carries() {
        let mut rec = Record::default();
        // n1: all three gates at 10, the first gone at 20, all at 30.
        rec.nodes.insert(
            "n1".into(),
            vec![
                seen(10, NodeState::new(0b111, String::new())),
                seen(20, NodeState::new(0b110, String::new())),
                seen(30, NodeState::new(0, String::new())),
            ],
        );
        let bound = |tolerated: u8| Binding {
            node: "n1".into(),
            tolerated,
        };
        rec.pods
            .insert("first-only".into(), vec![seen(25, bound(0b001))]);
        rec.pods.insert("all".into(), vec![seen(25, bound(0b111))]);
        rec.pods.insert("after".into(), vec![seen(31, bound(0))]);
        assert_eq!(bound_while_gated(&rec, 0), ["first-only on n1"]);
        let csi = pod(serde_json::json!([
            {"key": "nodegate.dev/csi-not-ready", "operator": "Exists"}
        ]));
        assert_eq!(tolerated(&csi), 0b010);
        assert_eq!(
            tolerated(&pod(serde_json::json!([{"operator": "Exists"}]))),
            0b111
        );
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"taints": [
                {"key": "nodegate.dev/gpu-not-ready", "value": "true", "effect": "NoSchedule"},
                {"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoExecute"},
            ]},
        }))
        .unwrap();
        assert_eq!(gate_bits(&node), 0b100);
    }
}
