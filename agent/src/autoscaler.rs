//! What an autoscaler leaves on a Node that shows it did not wait for the
//! gate, read without I/O from the Node version the ready patch was applied
//! to (the patch's answer: the patch changes no label and adds no taint, so
//! what it shows besides the gate was there before the untaint).
//!
//! - **Karpenter** (`Initialization.Reconcile`,
//!   `pkg/controllers/nodeclaim/lifecycle/initialization.go`) labels a Node
//!   `karpenter.sh/initialized=true` once it is Ready and its *declared*
//!   startupTaints and known ephemeral taints are gone; it ignores any other
//!   taint. The label on a still-gated node means the gate is neither, so the
//!   provisioner counted the node as one the pending pods do not fit.
//! - **Cluster Autoscaler** leaves a registered node that is not ready yet
//!   (a declared startup taint makes it so) out of scale-down while it is
//!   younger than `MaxNodeStartupTime` (`core/static_autoscaler.go`
//!   `RunOnce`, `allRegisteredUpcoming`; `clusterstate/clusterstate.go`
//!   `ClusterStateRegistry.updateReadinessStats`). Only a node it counts as
//!   Ready can be judged unneeded and get
//!   `DeletionCandidateOfClusterAutoscaler`
//!   (`core/scaledown/actuation/softtaint.go` `UpdateSoftDeletionTaints`) or
//!   `ToBeDeletedByClusterAutoscaler` (`actuator.go` `Actuator.taintNode`).
//!
//! CA's window, all paths under `cluster-autoscaler/`:
//!
//! - up to release 1.34, `MaxNodeStartupTime` is a constant, 15 min
//!   (`clusterstate/clusterstate.go`), read by `updateReadinessStats`;
//! - from 1.35 it is the flag `--max-node-startup-time` (default 15m,
//!   `config/flags/flags.go`), which a node group may override
//!   (`processors/nodegroupconfig/node_group_config_processor.go`
//!   `DelegatingNodeGroupConfigProcessor.GetMaxNodeStartupTime`, asked per
//!   node by `updateReadinessStats`).
//!
//! Past CA's window a node that is not ready counts as Unready, which
//! scale-down may consider, so CA's taints there prove nothing about the
//! declaration. The agent takes the window from `--ca-max-node-startup-time`
//! (default [`CA_MAX_NODE_STARTUP`]) and counts CA's taints only on nodes
//! younger than that. It cannot see a node group's override: it assumes the
//! flag's value for every node, and a group whose window is shorter would
//! have its declared gates reported as undeclared once its nodes are older
//! than that window. Set the flag to the shortest group's window to avoid
//! those false warnings (the signal then misses undeclared gates on nodes
//! between that window and a longer one).

use std::time::Duration;

use nodegate_shared::{NodeView, TaintSpec};

/// The label Karpenter puts on a Node it considers initialized.
pub const KARPENTER_INITIALIZED_LABEL: &str = "karpenter.sh/initialized";
/// Cluster Autoscaler's soft taint (PreferNoSchedule) on an unneeded node.
pub const CA_DELETION_CANDIDATE_TAINT: &str = "DeletionCandidateOfClusterAutoscaler";
/// Cluster Autoscaler's taint on a node it is deleting.
pub const CA_TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// Cluster Autoscaler's `MaxNodeStartupTime`: the constant up to 1.34, the
/// default of `--max-node-startup-time` from 1.35, and the default of the
/// agent's `--ca-max-node-startup-time`. Past it a node that is not ready
/// counts as Unready, which scale-down may consider even with the gate
/// declared as a startup taint: the taints prove nothing about the
/// declaration then.
pub const CA_MAX_NODE_STARTUP: Duration = Duration::from_secs(15 * 60);

/// Reason of the Warning Event when Karpenter marked the gated node initialized.
pub const KARPENTER_REASON: &str = "NodegateGateNotDeclared";
/// Reason of the Warning Event when Cluster Autoscaler judged the gated node
/// unneeded.
pub const CLUSTER_AUTOSCALER_REASON: &str = "NodegateGateNotStartupTaint";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autoscaler {
    Karpenter,
    ClusterAutoscaler,
}

impl Autoscaler {
    pub const ALL: [Autoscaler; 2] = [Autoscaler::Karpenter, Autoscaler::ClusterAutoscaler];

    /// The `autoscaler` label of `nodegate_agent_gate_undeclared_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Autoscaler::Karpenter => "karpenter",
            Autoscaler::ClusterAutoscaler => "cluster-autoscaler",
        }
    }

    /// The reason of its Warning Event.
    pub fn reason(self) -> &'static str {
        match self {
            Autoscaler::Karpenter => KARPENTER_REASON,
            Autoscaler::ClusterAutoscaler => CLUSTER_AUTOSCALER_REASON,
        }
    }
}

/// One autoscaler's mark on a gated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub autoscaler: Autoscaler,
    /// What was on the node: the label, or the taint key.
    pub mark: &'static str,
}

impl Finding {
    /// The Event's message, written as the fix, for the gate taints the
    /// ready patch removed.
    pub fn message(&self, gates: &[&TaintSpec]) -> String {
        let named = gates
            .iter()
            .map(|g| format!("{}:{}", g.key(), g.effect().as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        match self.autoscaler {
            Autoscaler::Karpenter => format!(
                "Karpenter marked this node initialized while nodegate's gate {named} was on it: \
                 declare the taint in the NodePool's spec.template.spec.startupTaints \
                 (nodegate-check prints the patch; applying it drifts the pool) — docs/autoscalers.md"
            ),
            Autoscaler::ClusterAutoscaler => {
                // CA compares startup taints by key alone.
                let mut flags: Vec<String> = Vec::new();
                for g in gates {
                    let flag = format!("--startup-taint={}", g.key());
                    if !flags.contains(&flag) {
                        flags.push(flag);
                    }
                }
                format!(
                    "Cluster Autoscaler put {} on this node while nodegate's gate {named} was on it: \
                     it counted the gated node as Ready (and empty), so pending pods that do not \
                     tolerate the gate made it scale up again. Make the gate a startup taint: {} on \
                     the autoscaler, or where it takes no flags a key under \
                     startup-taint.cluster-autoscaler.kubernetes.io/ (nodegate-check says which) — \
                     docs/autoscalers.md",
                    self.mark,
                    flags.join(" ")
                )
            }
        }
    }
}

/// The autoscalers' marks on `node`, the version the ready patch removed the
/// gate from; `age` is the node's age at the patch. Cluster Autoscaler's
/// taints count only on a node younger than `ca_window` (CA's
/// `MaxNodeStartupTime` as the agent assumes it, [`CA_MAX_NODE_STARTUP`] by
/// default), and not at all when the age is unknown.
pub fn findings(node: &NodeView, age: Option<Duration>, ca_window: Duration) -> Vec<Finding> {
    let mut out = Vec::new();
    if node
        .metadata
        .labels
        .get(KARPENTER_INITIALIZED_LABEL)
        .is_some_and(|v| v == "true")
    {
        out.push(Finding {
            autoscaler: Autoscaler::Karpenter,
            mark: KARPENTER_INITIALIZED_LABEL,
        });
    }
    if age.is_some_and(|a| a < ca_window) {
        let keys = node
            .taints()
            .iter()
            .filter_map(|t| t.get("key").and_then(|k| k.as_str()));
        // The deletion is the stronger statement when both are there.
        let mut mark = None;
        for k in keys {
            if k == CA_TO_BE_DELETED_TAINT {
                mark = Some(CA_TO_BE_DELETED_TAINT);
            } else if k == CA_DELETION_CANDIDATE_TAINT && mark.is_none() {
                mark = Some(CA_DELETION_CANDIDATE_TAINT);
            }
        }
        if let Some(mark) = mark {
            out.push(Finding {
                autoscaler: Autoscaler::ClusterAutoscaler,
                mark,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(labels: serde_json::Value, taints: serde_json::Value) -> NodeView {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": labels},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    #[test]
    fn marks_by_autoscaler() {
        let min = |m: u64| Some(Duration::from_secs(m * 60));
        let cand = json!({"key": CA_DELETION_CANDIDATE_TAINT, "value": "1700000000", "effect": "PreferNoSchedule"});
        let del =
            json!({"key": CA_TO_BE_DELETED_TAINT, "value": "1700000001", "effect": "NoSchedule"});
        let init = json!({KARPENTER_INITIALIZED_LABEL: "true"});
        // (labels, taints, age, what is found)
        let cases: [(_, _, _, &[(Autoscaler, &str)]); 9] = [
            (json!({}), json!([]), min(1), &[]),
            (
                init.clone(),
                json!([]),
                None,
                &[(Autoscaler::Karpenter, KARPENTER_INITIALIZED_LABEL)],
            ),
            (
                json!({KARPENTER_INITIALIZED_LABEL: "false"}),
                json!([]),
                min(1),
                &[],
            ),
            (
                json!({}),
                json!([cand]),
                min(3),
                &[(Autoscaler::ClusterAutoscaler, CA_DELETION_CANDIDATE_TAINT)],
            ),
            (
                json!({}),
                json!([del, cand]),
                min(14),
                &[(Autoscaler::ClusterAutoscaler, CA_TO_BE_DELETED_TAINT)],
            ),
            // Past MaxNodeStartupTime a declared startup taint allows them too.
            (json!({}), json!([cand]), min(15), &[]),
            (json!({}), json!([cand]), None, &[]),
            (
                init,
                json!([cand]),
                min(1),
                &[
                    (Autoscaler::Karpenter, KARPENTER_INITIALIZED_LABEL),
                    (Autoscaler::ClusterAutoscaler, CA_DELETION_CANDIDATE_TAINT),
                ],
            ),
            (
                json!({}),
                json!([{"key": "other", "effect": "NoSchedule"}]),
                min(1),
                &[],
            ),
        ];
        for (i, (labels, taints, age, want)) in cases.into_iter().enumerate() {
            let got: Vec<(Autoscaler, &str)> =
                findings(&node(labels, taints), age, CA_MAX_NODE_STARTUP)
                    .into_iter()
                    .map(|f| (f.autoscaler, f.mark))
                    .collect();
            assert_eq!(got, want, "case {i}");
        }
    }

    /// CA's window as the agent is told it: a node aged 10 min is past a
    /// 5 min window (CA may count it Unready and soft-taint it even with the
    /// gate declared) and inside the default 15 min one.
    #[test]
    fn ca_taints_count_only_inside_the_window() {
        let min = |m: u64| Duration::from_secs(m * 60);
        let cand = json!([{"key": CA_DELETION_CANDIDATE_TAINT, "value": "1700000000", "effect": "PreferNoSchedule"}]);
        let del =
            json!([{"key": CA_TO_BE_DELETED_TAINT, "value": "1700000001", "effect": "NoSchedule"}]);
        // (taints, age, window, what is found)
        let cases: [(_, _, _, &[(Autoscaler, &str)]); 7] = [
            (cand.clone(), min(10), min(5), &[]),
            (del.clone(), min(10), min(5), &[]),
            (
                cand.clone(),
                min(10),
                min(15),
                &[(Autoscaler::ClusterAutoscaler, CA_DELETION_CANDIDATE_TAINT)],
            ),
            (
                del,
                min(10),
                min(15),
                &[(Autoscaler::ClusterAutoscaler, CA_TO_BE_DELETED_TAINT)],
            ),
            // The window's end is outside it, as at the default.
            (cand.clone(), min(5), min(5), &[]),
            (
                cand.clone(),
                min(20),
                min(30),
                &[(Autoscaler::ClusterAutoscaler, CA_DELETION_CANDIDATE_TAINT)],
            ),
            // A zero window turns the Cluster Autoscaler signal off.
            (cand, Duration::ZERO, Duration::ZERO, &[]),
        ];
        for (i, (taints, age, window, want)) in cases.into_iter().enumerate() {
            let got: Vec<(Autoscaler, &str)> =
                findings(&node(json!({}), taints), Some(age), window)
                    .into_iter()
                    .map(|f| (f.autoscaler, f.mark))
                    .collect();
            assert_eq!(got, want, "case {i}: age {age:?}, window {window:?}");
        }
    }

    #[test]
    fn messages_name_the_gate_and_the_fix() {
        // Strict mode's boot gate shares the key.
        let specs: Vec<TaintSpec> = [
            "nodegate.dev/agent-not-ready=true:NoSchedule",
            "nodegate.dev/agent-not-ready=true:NoExecute",
        ]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
        let gates: Vec<&TaintSpec> = specs.iter().collect();
        let named =
            "nodegate.dev/agent-not-ready:NoSchedule, nodegate.dev/agent-not-ready:NoExecute";
        let k = Finding {
            autoscaler: Autoscaler::Karpenter,
            mark: KARPENTER_INITIALIZED_LABEL,
        }
        .message(&gates[..1]);
        assert_eq!(
            k,
            "Karpenter marked this node initialized while nodegate's gate \
             nodegate.dev/agent-not-ready:NoSchedule was on it: declare the taint in the \
             NodePool's spec.template.spec.startupTaints (nodegate-check prints the patch; \
             applying it drifts the pool) — docs/autoscalers.md"
        );
        let ca = Finding {
            autoscaler: Autoscaler::ClusterAutoscaler,
            mark: CA_DELETION_CANDIDATE_TAINT,
        }
        .message(&gates);
        assert!(
            ca.contains(named) && ca.contains(CA_DELETION_CANDIDATE_TAINT),
            "{ca}"
        );
        assert!(
            ca.contains(": --startup-taint=nodegate.dev/agent-not-ready on the autoscaler"),
            "{ca}"
        );
        assert!(ca.ends_with("docs/autoscalers.md"), "{ca}");
    }
}
