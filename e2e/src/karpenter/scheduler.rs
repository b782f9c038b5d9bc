//! One provisioning pass's scheduling simulation, reduced to taints and pod
//! slots: each pending pod goes to an existing node (registered or still in
//! flight) that tolerates it and has room, else to a NodeClaim this pass
//! already opened, else to a new NodeClaim of the first NodePool whose
//! template taints it tolerates.
//!
//! Upstream (`pkg/controllers/provisioning/scheduling/`): `scheduler.go`
//! `Scheduler.Solve` and `add` (`addToExistingNode`, then
//! `addToInflightNode` over the pass's NodeClaims sorted by pod count, then
//! `addToNewNodeClaim` over the NodePools in the order `provisioner.go`
//! `NewScheduler` gives them, `OrderByWeight`), `calculateExistingNodeClaims`
//! (each StateNode's `Taints()` cached in an `ExistingNode`) and
//! `sortExistingNodes` (initialized nodes first, then by name);
//! `existingnode.go` `ExistingNode.CanAdd` (taints first, then resources)
//! and `Add`; `nodeclaim.go` `NodeClaim.CanAdd` (the template's
//! `spec.taints` only: a new node's startup taints are expected to go).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::nodepool::NodePool;
use super::state::StateNode;
use super::taints::{first_untolerated, untolerated};
use super::version::Version;

/// A pending pod as the scheduler sees it.
#[derive(Debug, Clone, Copy)]
pub struct PendingPod<'a> {
    pub name: &'a str,
    pub tolerations: &'a [Toleration],
}

/// Why a node refused a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `did not tolerate taint`: the keys of every such taint.
    Untolerated(Vec<String>),
    /// `exceeds node resources`.
    Full,
}

/// `ExistingNode`: the taints cached at the start of the pass and the slots
/// left.
#[derive(Debug, Clone)]
pub struct ExistingNode {
    pub name: String,
    pub initialized: bool,
    pub taints: Vec<Taint>,
    pub remaining: usize,
    pub pods: Vec<String>,
}

impl ExistingNode {
    pub fn new(s: &StateNode<'_>, v: Version) -> Self {
        Self {
            name: s.name().to_string(),
            initialized: s.initialized(),
            taints: s.taints(v),
            remaining: s.available(),
            pods: Vec::new(),
        }
    }

    /// `CanAdd`: taints, then room.
    pub fn can_add(&self, tolerations: &[Toleration]) -> Result<(), Refusal> {
        let refused = untolerated(&self.taints, tolerations);
        if !refused.is_empty() {
            return Err(Refusal::Untolerated(
                refused.into_iter().map(|t| t.key.clone()).collect(),
            ));
        }
        if self.remaining == 0 {
            return Err(Refusal::Full);
        }
        Ok(())
    }
}

/// A NodeClaim this pass decided to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNodeClaim {
    pub nodepool: String,
    pub pods: Vec<String>,
}

struct Opened<'a> {
    nodepool: &'a NodePool,
    remaining: usize,
    pods: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Results {
    pub new_node_claims: Vec<NewNodeClaim>,
    /// Existing node name → pods nominated to it.
    pub existing: BTreeMap<String, Vec<String>>,
    /// Pods nothing could take, with the reason.
    pub errors: BTreeMap<String, String>,
    /// For pods sent to a NodeClaim (in flight or new) although an existing
    /// node had room: the taint keys that turned them away (every untolerated
    /// taint of each such node), each counted once per pod.
    pub refused_by_taint: BTreeMap<String, usize>,
}

/// `Solve` for `pods` against `nodes` (initialized first, then by name) and
/// the NodePools (highest weight first, then by name), each new node holding
/// `pod_slots` pods.
pub fn solve(
    pods: &[PendingPod<'_>],
    nodes: &[StateNode<'_>],
    nodepools: &[NodePool],
    pod_slots: usize,
    v: Version,
) -> Results {
    let mut existing: Vec<ExistingNode> = nodes.iter().map(|s| ExistingNode::new(s, v)).collect();
    // sortExistingNodes
    existing.sort_by(|a, b| {
        b.initialized
            .cmp(&a.initialized)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut templates: Vec<&NodePool> = nodepools.iter().collect();
    templates.sort_by(|a, b| b.weight().cmp(&a.weight()).then(a.name().cmp(b.name())));
    let mut opened: Vec<Opened> = Vec::new();
    let mut res = Results::default();

    for pod in pods {
        // addToExistingNode: the first node, in order, that can take it.
        let mut refused_by = BTreeSet::new();
        let mut placed = false;
        for n in existing.iter_mut() {
            match n.can_add(pod.tolerations) {
                Ok(()) => {
                    n.remaining -= 1;
                    n.pods.push(pod.name.to_string());
                    placed = true;
                    break;
                }
                Err(Refusal::Untolerated(keys)) if n.remaining > 0 => {
                    refused_by.extend(keys);
                }
                Err(_) => {}
            }
        }
        if placed {
            continue;
        }
        for key in refused_by {
            *res.refused_by_taint.entry(key).or_default() += 1;
        }
        // addToInflightNode: the pass's NodeClaims, fewest pods first.
        opened.sort_by_key(|o| o.pods.len());
        if let Some(o) = opened.iter_mut().find(|o| {
            o.remaining > 0
                && first_untolerated(&o.nodepool.spec.template.spec.taints, pod.tolerations)
                    .is_none()
        }) {
            o.remaining -= 1;
            o.pods.push(pod.name.to_string());
            continue;
        }
        // addToNewNodeClaim: the first template that tolerates it.
        match templates
            .iter()
            .find(|np| first_untolerated(&np.spec.template.spec.taints, pod.tolerations).is_none())
        {
            Some(np) if pod_slots > 0 => opened.push(Opened {
                nodepool: np,
                remaining: pod_slots - 1,
                pods: vec![pod.name.to_string()],
            }),
            _ => {
                res.errors.insert(
                    pod.name.to_string(),
                    "no NodePool tolerated by the pod has room".to_string(),
                );
            }
        }
    }
    res.existing = existing
        .into_iter()
        .filter(|n| !n.pods.is_empty())
        .map(|n| (n.name, n.pods))
        .collect();
    res.new_node_claims = opened
        .into_iter()
        .map(|o| NewNodeClaim {
            nodepool: o.nodepool.name().to_string(),
            pods: o.pods,
        })
        .collect();
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::karpenter::nodeclaim::NodeClaim;
    use crate::karpenter::state::REGISTERED_LABEL;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    const GATE: &str = "nodegate.dev/agent-not-ready";

    fn pool(name: &str, weight: i32, taints: &str) -> NodePool {
        NodePool::from_yaml(&format!(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: {name}}}\n\
             spec:\n  weight: {weight}\n  template:\n    spec:\n      taints: {taints}\n"
        ))
        .unwrap()
    }

    fn claim(name: &str) -> NodeClaim {
        NodeClaim::from_nodepool(&pool("default", 0, "[]"), name, "p://x", 2)
    }

    fn gated_node() -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {REGISTERED_LABEL: "true"}},
            "spec": {"taints": [{"key": GATE, "value": "true", "effect": "NoSchedule"}]},
        }))
        .unwrap()
    }

    fn pods(names: &[&'static str]) -> Vec<PendingPod<'static>> {
        names
            .iter()
            .map(|n| PendingPod {
                name: n,
                tolerations: &[],
            })
            .collect()
    }

    #[test]
    fn existing_then_inflight_then_new() {
        let pools = [pool("default", 0, "[]")];
        let (c1, c2) = (claim("default-001"), claim("default-002"));
        let gated = gated_node();
        let nodes = [
            // Registered and gated: refuses every pod.
            StateNode {
                claim: &c1,
                node: Some(&gated),
                bound_pods: 0,
            },
            // In flight, one slot left.
            StateNode {
                claim: &c2,
                node: None,
                bound_pods: 1,
            },
        ];
        let r = solve(
            &pods(&["a", "b", "c", "d"]),
            &nodes,
            &pools,
            2,
            Version::READ,
        );
        assert_eq!(r.existing["default-002"], vec!["a"]);
        let opened: Vec<(&str, Vec<String>)> = r
            .new_node_claims
            .iter()
            .map(|c| (c.nodepool.as_str(), c.pods.clone()))
            .collect();
        assert_eq!(
            opened,
            vec![
                ("default", vec!["b".to_string(), "c".to_string()]),
                ("default", vec!["d".to_string()]),
            ]
        );
        // "a" fitted the second node; b, c, d were turned away by the gate
        // of a node with room.
        assert_eq!(r.refused_by_taint[GATE], 3);
        assert!(r.errors.is_empty());
    }

    #[test]
    fn initialized_nodes_first_then_by_name() {
        let pools = [pool("default", 0, "[]")];
        let (c1, c2) = (claim("default-001"), claim("default-002"));
        let labelled = |name: &str, initialized: bool| -> Node {
            let mut labels = json!({REGISTERED_LABEL: "true"});
            if initialized {
                labels[crate::karpenter::state::INITIALIZED_LABEL] = json!("true");
            }
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
        };
        let (a, b) = (labelled("a", false), labelled("b", true));
        let nodes = [
            StateNode {
                claim: &c1,
                node: Some(&a),
                bound_pods: 0,
            },
            StateNode {
                claim: &c2,
                node: Some(&b),
                bound_pods: 0,
            },
        ];
        let r = solve(&pods(&["p"]), &nodes, &pools, 2, Version::READ);
        // "b" is initialized: it comes before "a".
        assert_eq!(r.existing.keys().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn templates_by_weight_and_their_taints() {
        let pools = [
            pool("light", 1, "[]"),
            pool(
                "heavy",
                10,
                "[{key: dedicated, value: gpu, effect: NoSchedule}]",
            ),
        ];
        let r = solve(&pods(&["a"]), &[], &pools, 5, Version::READ);
        // The heavier pool's taint is not tolerated: the next one.
        assert_eq!(r.new_node_claims[0].nodepool, "light");
        let only_tainted = [pools[1].clone()];
        let r = solve(&pods(&["a"]), &[], &only_tainted, 5, Version::READ);
        assert!(r.new_node_claims.is_empty());
        assert!(r.errors.contains_key("a"));
    }
}
