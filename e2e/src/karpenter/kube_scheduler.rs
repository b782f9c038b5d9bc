//! kube-scheduler reduced to what decides whether a pending pod can leave
//! the provisioner's view: a node is feasible if the pod tolerates every
//! `NoSchedule` and `NoExecute` taint on it and a pod slot is free; of the
//! feasible nodes the one with the most free slots wins (name breaks ties).
//! Pods carry the tolerations every pod gets at admission.
//!
//! Upstream (kubernetes/kubernetes): `pkg/scheduler/framework/plugins/
//! tainttoleration` `Filter` (`FindMatchingUntoleratedTaint` over
//! NoSchedule and NoExecute); `noderesources` `Fit` and the
//! `LeastAllocated` score, here on a pod count; `nodeunschedulable`;
//! `plugin/pkg/admission/defaulttolerationseconds` (not-ready and
//! unreachable, `NoExecute`, 300 s).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Toleration};
use nodegate_emulator::tolerations::{COMPARISON_OPERATORS_DEFAULT, first_untolerated};

use super::state::node_taints;
use super::taints::{NO_EXECUTE, NO_SCHEDULE, NOT_READY_KEY, UNREACHABLE_KEY};

/// The tolerations DefaultTolerationSeconds adds to every pod.
pub fn default_tolerations() -> Vec<Toleration> {
    [NOT_READY_KEY, UNREACHABLE_KEY]
        .into_iter()
        .map(|key| Toleration {
            key: Some(key.to_string()),
            operator: Some("Exists".to_string()),
            effect: Some(NO_EXECUTE.to_string()),
            toleration_seconds: Some(300),
            value: None,
        })
        .collect()
}

/// A node as the scheduler sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub node: &'a Node,
    pub free: usize,
}

fn name(n: &Node) -> &str {
    n.metadata.name.as_deref().unwrap_or_default()
}

/// Filters: taint toleration, unschedulable, room.
pub fn feasible(c: &Candidate<'_>, tolerations: &[Toleration]) -> bool {
    let blocking =
        |t: &k8s_openapi::api::core::v1::Taint| t.effect == NO_SCHEDULE || t.effect == NO_EXECUTE;
    let unschedulable = c
        .node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    c.free > 0
        && !unschedulable
        && first_untolerated(
            node_taints(c.node),
            tolerations,
            blocking,
            COMPARISON_OPERATORS_DEFAULT,
        )
        .is_none()
}

/// One scheduling cycle per pod, in order: pod name → node name for each
/// pod bound. Free slots go down as pods bind.
pub fn bind(
    pods: &[(&str, &[Toleration])],
    candidates: &[Candidate<'_>],
) -> BTreeMap<String, String> {
    let mut free: Vec<usize> = candidates.iter().map(|c| c.free).collect();
    let mut out = BTreeMap::new();
    for (pod, tolerations) in pods {
        let best = candidates
            .iter()
            .enumerate()
            .filter(|(i, c)| {
                feasible(
                    &Candidate {
                        node: c.node,
                        free: free[*i],
                    },
                    tolerations,
                )
            })
            .max_by(|(i, a), (j, b)| free[*i].cmp(&free[*j]).then(name(b.node).cmp(name(a.node))));
        if let Some((i, c)) = best {
            free[i] -= 1;
            out.insert(pod.to_string(), name(c.node).to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"taints": taints}}))
            .unwrap()
    }

    #[test]
    fn binds_where_tolerated_and_free_spreading_by_free_slots() {
        let open = node("b", json!([]));
        let also_open = node("a", json!([]));
        let gated = node(
            "c",
            json!([{"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"}]),
        );
        let not_ready_exec = node("d", json!([{"key": NOT_READY_KEY, "effect": "NoExecute"}]));
        let cands = [
            Candidate {
                node: &open,
                free: 2,
            },
            Candidate {
                node: &also_open,
                free: 1,
            },
            Candidate {
                node: &gated,
                free: 9,
            },
            Candidate {
                node: &not_ready_exec,
                free: 0,
            },
        ];
        let tol = default_tolerations();
        let pods: Vec<(&str, &[Toleration])> = ["p1", "p2", "p3", "p4"]
            .iter()
            .map(|p| (*p, tol.as_slice()))
            .collect();
        let got = bind(&pods, &cands);
        // b (2 free) first, then a and b tie at 1: a by name, then b; p4 waits.
        assert_eq!(got["p1"], "b");
        assert_eq!(got["p2"], "a");
        assert_eq!(got["p3"], "b");
        assert!(!got.contains_key("p4"));
        // The not-ready NoExecute taint is tolerated by default.
        assert!(feasible(
            &Candidate {
                node: &not_ready_exec,
                free: 1
            },
            &tol
        ));
        assert!(!feasible(
            &Candidate {
                node: &not_ready_exec,
                free: 1
            },
            &[]
        ));
    }
}
