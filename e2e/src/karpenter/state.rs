//! Karpenter's cluster-state view of one NodeClaim and its Node: what the
//! provisioner schedules pending pods against.
//!
//! Upstream: `pkg/controllers/state/statenode.go` — `StateNode.Taints`,
//! `Registered`, `Initialized`, `Managed`, `Name`.

use k8s_openapi::api::core::v1::{Node, Taint};

use super::nodeclaim::NodeClaim;
use super::taints::{is_known_ephemeral_taint, match_taint};
use super::version::Version;

pub const REGISTERED_LABEL: &str = "karpenter.sh/registered";
pub const INITIALIZED_LABEL: &str = "karpenter.sh/initialized";

/// A NodeClaim, its Node once there is one, and the pods bound to it.
#[derive(Debug, Clone, Copy)]
pub struct StateNode<'a> {
    pub claim: &'a NodeClaim,
    pub node: Option<&'a Node>,
    /// Pods bound to the Node, as the pod informer shows them.
    pub bound_pods: usize,
}

/// The value of a Node label.
pub fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// A Node's `spec.taints`.
pub fn node_taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

impl StateNode<'_> {
    /// `Registered`: the Node carries `karpenter.sh/registered=true`.
    pub fn registered(&self) -> bool {
        self.node
            .is_some_and(|n| label(n, REGISTERED_LABEL) == Some("true"))
    }

    /// `Initialized`: the Node carries `karpenter.sh/initialized=true`.
    pub fn initialized(&self) -> bool {
        self.node
            .is_some_and(|n| label(n, INITIALIZED_LABEL) == Some("true"))
    }

    /// `Name`: the NodeClaim's until the Node is registered.
    pub fn name(&self) -> &str {
        match self.node {
            Some(n) if self.registered() => n.metadata.name.as_deref().unwrap_or_default(),
            _ => &self.claim.name,
        }
    }

    /// `Taints`: the NodeClaim's `spec.taints` until the Node is registered,
    /// then the Node's. Until the Node is initialized, known ephemeral taints
    /// and the NodeClaim's startup taints (key and effect) are dropped; any
    /// other taint counts from registration on, whatever the node's Ready
    /// condition says.
    pub fn taints(&self, v: Version) -> Vec<Taint> {
        let taints: &[Taint] = match self.node {
            Some(n) if self.registered() => node_taints(n),
            _ => &self.claim.taints,
        };
        if self.initialized() {
            return taints.to_vec();
        }
        taints
            .iter()
            .filter(|t| {
                !is_known_ephemeral_taint(t, v)
                    && !self.claim.startup_taints.iter().any(|s| match_taint(s, t))
            })
            .cloned()
            .collect()
    }

    /// Pod slots left: the instance's capacity less the pods bound.
    pub fn available(&self) -> usize {
        self.claim.pod_slots.saturating_sub(self.bound_pods)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::karpenter::taints::{self, NO_EXECUTE, NO_SCHEDULE};
    use serde_json::json;

    const GATE: &str = "nodegate.dev/agent-not-ready";

    fn claim(startup: Vec<Taint>) -> NodeClaim {
        NodeClaim {
            name: "default-001".into(),
            nodepool: "default".into(),
            labels: Default::default(),
            annotations: Default::default(),
            taints: vec![],
            startup_taints: startup,
            provider_id: "p://1".into(),
            pod_slots: 10,
            registered: false,
            node_name: None,
            initialized: false,
        }
    }

    fn node(labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": labels},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    fn keys(ts: &[Taint]) -> Vec<&str> {
        ts.iter().map(|t| t.key.as_str()).collect()
    }

    #[test]
    fn taints_through_the_lifecycle() {
        let v = Version::READ;
        let gated = json!([
            {"key": GATE, "value": "true", "effect": NO_SCHEDULE},
            {"key": taints::NOT_READY_KEY, "effect": NO_SCHEDULE},
            {"key": taints::UNREGISTERED_KEY, "effect": NO_EXECUTE},
        ]);
        let undeclared = claim(vec![]);
        let declared = claim(vec![taints::taint(GATE, "other value", NO_SCHEDULE)]);
        let other_effect = claim(vec![taints::taint(GATE, "true", NO_EXECUTE)]);
        let cases = [
            // (claim, labels, expected keys)
            // Not registered: the NodeClaim's taints (none), whatever the Node has.
            (&undeclared, json!({}), vec![]),
            // Registered, not initialized: the undeclared gate counts.
            (&undeclared, json!({REGISTERED_LABEL: "true"}), vec![GATE]),
            // Declared (value ignored): dropped until initialized.
            (&declared, json!({REGISTERED_LABEL: "true"}), vec![]),
            // Declared with another effect: not the same taint.
            (&other_effect, json!({REGISTERED_LABEL: "true"}), vec![GATE]),
            // Initialized: every taint counts, declared or not.
            (
                &declared,
                json!({REGISTERED_LABEL: "true", INITIALIZED_LABEL: "true"}),
                vec![GATE, taints::NOT_READY_KEY, taints::UNREGISTERED_KEY],
            ),
        ];
        for (c, labels, want) in cases {
            let n = node(labels.clone(), gated.clone());
            let s = StateNode {
                claim: c,
                node: Some(&n),
                bound_pods: 3,
            };
            assert_eq!(keys(&s.taints(v)), want, "{labels} {:?}", c.startup_taints);
        }
        // A reboot puts a readiness.k8s.io/ taint back on an initialized
        // Node: known ephemeral since v1.13.0, and it counts all the same.
        let readiness = json!([{"key": "readiness.k8s.io/net", "effect": NO_SCHEDULE}]);
        let rebooted = node(
            json!({REGISTERED_LABEL: "true", INITIALIZED_LABEL: "true"}),
            readiness.clone(),
        );
        let registered = node(json!({REGISTERED_LABEL: "true"}), readiness);
        let on = |n| StateNode {
            claim: &undeclared,
            node: Some(n),
            bound_pods: 0,
        };
        let v13 = Version::READINESS_PREFIX;
        assert_eq!(keys(&on(&rebooted).taints(v13)), ["readiness.k8s.io/net"]);
        assert!(on(&registered).taints(v13).is_empty());

        let s = StateNode {
            claim: &undeclared,
            node: None,
            bound_pods: 0,
        };
        assert!(s.taints(v).is_empty() && !s.registered() && !s.initialized());
        assert_eq!((s.name(), s.available()), ("default-001", 10));
    }
}
