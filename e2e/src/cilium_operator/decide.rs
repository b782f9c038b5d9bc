//! What cilium-operator's node-taint controller does for one node, given
//! its informer caches: a pure function, no I/O.
//!
//! Upstream: `operator/watchers/node_taint.go` — `checkAndMarkNode`,
//! `nodeHasCiliumPod`, `hasAgentNotReadyTaint`, `HasCiliumIsUpCondition`,
//! `markNode`, `removeNodeTaint`, `setNodeTaint`,
//! `setNodeNetworkUnavailableFalse`; pod readiness is
//! `pkg/k8s/utils` `GetLatestPodReadiness`.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::config::OperatorConfig;

/// `ciliumNodeConditionReason`.
pub const CILIUM_IS_UP_REASON: &str = "CiliumIsUp";
/// The condition's message in `setNodeNetworkUnavailableFalse`.
pub const CILIUM_IS_UP_MESSAGE: &str = "Cilium is running on this node";

/// A Cilium pod as the operator's pod cache holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumPod {
    pub name: String,
    /// `GetLatestPodReadiness(status) == True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

impl CiliumPod {
    /// `(spec.nodeName, pod)` as upstream's cache holds it.
    /// `transformToCiliumPod` keeps only name, namespace, resourceVersion,
    /// `spec.nodeName` and `status.conditions` — the deletionTimestamp is
    /// dropped, so `deleting` is always false here and the deleting-pod skip
    /// in `nodeHasCiliumPod` never fires upstream: a terminating pod that
    /// is still Ready counts as running.
    pub fn from_cached(pod: &Pod) -> Option<(String, CiliumPod)> {
        let node = pod.spec.as_ref()?.node_name.clone()?;
        Some((
            node,
            CiliumPod {
                name: pod.metadata.name.clone().unwrap_or_default(),
                ready: latest_pod_readiness(pod) == "True",
                deleting: false,
            },
        ))
    }
}

/// `GetLatestPodReadiness`: the status of the first `Ready` condition,
/// `Unknown` without one. The phase is not looked at.
pub fn latest_pod_readiness(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map_or("Unknown", |c| c.status.as_str())
}

/// `nodeHasCiliumPod`: `(scheduled, running)`. Any cached pod on the node
/// makes it scheduled — deleting ones too; running needs a Ready one that
/// is not deleting.
pub fn node_has_cilium_pod(pods: &[CiliumPod]) -> (bool, bool) {
    if pods.is_empty() {
        return (false, false);
    }
    let running = pods.iter().any(|p| !p.deleting && p.ready);
    (true, running)
}

fn taints(node: &Node) -> Option<&Vec<Taint>> {
    node.spec.as_ref().and_then(|s| s.taints.as_ref())
}

/// `hasAgentNotReadyTaint`: any taint with the key, whatever its value and effect.
pub fn has_agent_not_ready_taint(node: &Node, key: &str) -> bool {
    taints(node).is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

/// `HasCiliumIsUpCondition`: NetworkUnavailable, False, reason CiliumIsUp.
pub fn has_cilium_is_up_condition(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "NetworkUnavailable"
                    && c.status == "False"
                    && c.reason.as_deref() == Some(CILIUM_IS_UP_REASON)
            })
        })
}

/// One write of `markNode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `removeNodeTaint`.
    RemoveTaint,
    /// `setNodeNetworkUnavailableFalse`.
    SetCondition,
    /// `setNodeTaint`.
    SetTaint,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::RemoveTaint => "remove-taint",
            Action::SetCondition => "set-condition",
            Action::SetTaint => "set-taint",
        }
    }
}

/// `checkAndMarkNode` then `markNode`: the steps, in `markNode`'s order.
/// Each step re-reads the node from the cache and may still find nothing
/// to do ([`write_for`]). Nothing at all unless the controller runs
/// (`registerNodeTaintSync`).
pub fn check_and_mark_node(node: &Node, pods: &[CiliumPod], cfg: &OperatorConfig) -> Vec<Action> {
    if !cfg.controller_enabled() {
        return Vec::new();
    }
    let (scheduled, running) = node_has_cilium_pod(pods);
    let tainted = has_agent_not_ready_taint(node, &cfg.taint_key);
    let mut steps = Vec::new();
    if running {
        if (cfg.remove_node_taints && tainted)
            || (cfg.set_cilium_is_up_condition && !has_cilium_is_up_condition(node))
        {
            // markNode(running=true): both, each guarded by its option.
            if cfg.remove_node_taints {
                steps.push(Action::RemoveTaint);
            }
            if cfg.set_cilium_is_up_condition {
                steps.push(Action::SetCondition);
            }
        }
    } else if scheduled && cfg.set_node_taints && !tainted {
        // markNode(running=false).
        steps.push(Action::SetTaint);
    }
    steps
}

/// A taint as Go marshals `corev1.Taint` (`value` and `timeAdded` are
/// `omitempty`), so `test` compares what upstream sends.
fn taint_json(t: &Taint) -> Value {
    let mut v = json!({"key": t.key, "effect": t.effect});
    if let Some(val) = t.value.as_deref().filter(|s| !s.is_empty()) {
        v["value"] = json!(val);
    }
    if let Some(at) = &t.time_added {
        v["timeAdded"] = json!(at);
    }
    v
}

/// The cached list as Go marshals the slice: `null` when absent, `[]` when empty.
fn taints_json(node: &Node) -> Value {
    taints(node).map_or(Value::Null, |ts| {
        Value::Array(ts.iter().map(taint_json).collect())
    })
}

/// `removeNodeTaint`: a JSON patch that tests the cached list and replaces
/// it with the list without every taint of `key`; `None` if there is none.
/// An emptied list is `null` (Go's nil slice).
pub fn remove_node_taint(node: &Node, key: &str) -> Option<Value> {
    let ts = taints(node)?;
    if !ts.iter().any(|t| t.key == key) {
        return None;
    }
    let kept: Vec<Value> = ts.iter().filter(|t| t.key != key).map(taint_json).collect();
    let kept = if kept.is_empty() {
        Value::Null
    } else {
        Value::Array(kept)
    };
    Some(json!([
        {"op": "test", "path": "/spec/taints", "value": taints_json(node)},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]))
}

/// `setNodeTaint`: test the cached list, replace it with the list plus
/// `key:NoSchedule` with an empty value; `None` if any taint has the key.
pub fn set_node_taint(node: &Node, key: &str) -> Option<Value> {
    if has_agent_not_ready_taint(node, key) {
        return None;
    }
    let mut new: Vec<Value> = taints(node).into_iter().flatten().map(taint_json).collect();
    new.push(json!({"key": key, "effect": "NoSchedule"}));
    Some(json!([
        {"op": "test", "path": "/spec/taints", "value": taints_json(node)},
        {"op": "replace", "path": "/spec/taints", "value": new},
    ]))
}

/// `setNodeNetworkUnavailableFalse`: the strategic merge patch of
/// `nodes/status` (`PatchStatus`); `None` if the condition is there.
pub fn set_network_unavailable_false(node: &Node, now: &Time) -> Option<Value> {
    if has_cilium_is_up_condition(node) {
        return None;
    }
    let c = NodeCondition {
        type_: "NetworkUnavailable".into(),
        status: "False".into(),
        reason: Some(CILIUM_IS_UP_REASON.into()),
        message: Some(CILIUM_IS_UP_MESSAGE.into()),
        last_transition_time: Some(now.clone()),
        last_heartbeat_time: Some(now.clone()),
    };
    Some(json!({"status": {"conditions": [c]}}))
}

/// A write to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub action: Action,
    /// The body: a JSON patch of the node for the taint actions, a
    /// strategic merge patch of `nodes/status` for the condition.
    pub patch: Value,
}

impl Write {
    /// Whether it goes to the `status` subresource.
    pub fn is_status(&self) -> bool {
        self.action == Action::SetCondition
    }
}

/// The write of one step against the node as the cache holds it now.
pub fn write_for(action: Action, node: &Node, cfg: &OperatorConfig, now: &Time) -> Option<Write> {
    let patch = match action {
        Action::RemoveTaint => remove_node_taint(node, &cfg.taint_key),
        Action::SetTaint => set_node_taint(node, &cfg.taint_key),
        Action::SetCondition => set_network_unavailable_false(node, now),
    }?;
    Some(Write { action, patch })
}

/// Everything upstream would write for `node` from one snapshot of its
/// caches, in order.
pub fn decide(node: &Node, pods: &[CiliumPod], cfg: &OperatorConfig, now: &Time) -> Vec<Write> {
    check_and_mark_node(node, pods, cfg)
        .into_iter()
        .filter_map(|a| write_for(a, node, cfg, now))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cilium_operator::config::DEFAULT_TAINT_KEY as KEY;

    fn now() -> Time {
        Time("2026-01-02T03:04:05Z".parse().unwrap())
    }

    fn node(taints: Value, conditions: Value) -> Node {
        let mut spec = json!({});
        if !taints.is_null() {
            spec["taints"] = taints;
        }
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "spec": spec,
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    fn up() -> Value {
        json!([{"type": "NetworkUnavailable", "status": "False", "reason": "CiliumIsUp"}])
    }

    fn pod(ready: bool, deleting: bool) -> CiliumPod {
        CiliumPod {
            name: "cilium-x".into(),
            ready,
            deleting,
        }
    }

    fn actions(w: &[Write]) -> Vec<Action> {
        w.iter().map(|w| w.action).collect()
    }

    #[test]
    fn readiness_is_the_first_ready_condition() {
        let p = |conds: Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"}, "status": {"phase": "Running", "conditions": conds}}))
                .unwrap()
        };
        assert_eq!(latest_pod_readiness(&p(json!([]))), "Unknown");
        assert_eq!(
            latest_pod_readiness(&p(json!([{"type": "Ready", "status": "True"}]))),
            "True"
        );
        assert_eq!(
            latest_pod_readiness(&p(
                json!([{"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "False"}])
            )),
            "False"
        );
        // The cache drops deletionTimestamp (transformToCiliumPod).
        let mut deleting = p(json!([{"type": "Ready", "status": "True"}]));
        deleting.metadata.deletion_timestamp = Some(now());
        deleting.spec =
            Some(serde_json::from_value(json!({"nodeName": "n1", "containers": []})).unwrap());
        let (n, cp) = CiliumPod::from_cached(&deleting).unwrap();
        assert_eq!((n.as_str(), cp.ready, cp.deleting), ("n1", true, false));
        // Not yet scheduled: not indexed under any node (ciliumPodHandler skips it).
        assert!(CiliumPod::from_cached(&p(json!([]))).is_none());
    }

    #[test]
    fn node_has_cilium_pod_table() {
        // nodeHasCiliumPod: (pods, scheduled, running)
        let cases = [
            (vec![], false, false),
            (vec![pod(false, false)], true, false),
            (vec![pod(true, false)], true, true),
            // A deleting pod is skipped for running but still counts as scheduled.
            (vec![pod(true, true)], true, false),
            (vec![pod(true, true), pod(true, false)], true, true),
            (vec![pod(false, false), pod(true, false)], true, true),
        ];
        for (pods, scheduled, running) in cases {
            assert_eq!(node_has_cilium_pod(&pods), (scheduled, running), "{pods:?}");
        }
    }

    /// The operator's configurations the table runs under.
    struct Configs {
        helm: OperatorConfig,
        no_remove: OperatorConfig,
        no_cond: OperatorConfig,
        /// set-cilium-node-taints false.
        flag_defaults: OperatorConfig,
        only_set: OperatorConfig,
    }

    fn configs() -> Configs {
        let helm = OperatorConfig::helm_defaults();
        Configs {
            no_remove: OperatorConfig {
                remove_node_taints: false,
                ..helm.clone()
            },
            no_cond: OperatorConfig {
                set_cilium_is_up_condition: false,
                ..helm.clone()
            },
            flag_defaults: OperatorConfig::default(),
            only_set: OperatorConfig {
                remove_node_taints: false,
                set_cilium_is_up_condition: false,
                ..helm.clone()
            },
            helm,
        }
    }

    /// (name, config, taints, conditions, pods, expected steps)
    type Case<'a> = (
        &'a str,
        &'a OperatorConfig,
        Value,
        Value,
        Vec<CiliumPod>,
        Vec<Action>,
    );

    fn tainted() -> Value {
        json!([{"key": KEY, "effect": "NoSchedule"}])
    }

    fn plain() -> Value {
        json!([{"key": "other", "effect": "NoSchedule"}])
    }

    /// A Cilium pod on the node is running.
    fn running_cases(cfg: &Configs) -> Vec<Case<'_>> {
        use Action::*;
        vec![
            // checkAndMarkNode, running branch.
            (
                "ready, tainted, no condition",
                &cfg.helm,
                tainted(),
                json!([]),
                vec![pod(true, false)],
                vec![RemoveTaint, SetCondition],
            ),
            // markNode runs both steps; setNodeNetworkUnavailableFalse then finds nothing to do.
            (
                "ready, tainted, condition set",
                &cfg.helm,
                tainted(),
                up(),
                vec![pod(true, false)],
                vec![RemoveTaint, SetCondition],
            ),
            // Untainted but no condition: markNode again, removeNodeTaint finds no taint.
            (
                "ready, untainted, no condition",
                &cfg.helm,
                plain(),
                json!([]),
                vec![pod(true, false)],
                vec![RemoveTaint, SetCondition],
            ),
            (
                "ready, untainted, condition set",
                &cfg.helm,
                plain(),
                up(),
                vec![pod(true, false)],
                vec![],
            ),
            (
                "ready, remove off, tainted, condition set",
                &cfg.no_remove,
                tainted(),
                up(),
                vec![pod(true, false)],
                vec![],
            ),
            (
                "ready, remove off, no condition",
                &cfg.no_remove,
                tainted(),
                json!([]),
                vec![pod(true, false)],
                vec![SetCondition],
            ),
            (
                "ready, condition off, tainted",
                &cfg.no_cond,
                tainted(),
                json!([]),
                vec![pod(true, false)],
                vec![RemoveTaint],
            ),
        ]
    }

    /// No Cilium pod on the node is running, or none is cached, or the
    /// controller is off.
    fn not_running_cases(cfg: &Configs) -> Vec<Case<'_>> {
        use Action::*;
        vec![
            // Scheduled-but-not-running branch.
            (
                "not ready, untainted",
                &cfg.helm,
                plain(),
                json!([]),
                vec![pod(false, false)],
                vec![SetTaint],
            ),
            (
                "not ready, no taints at all",
                &cfg.helm,
                Value::Null,
                json!([]),
                vec![pod(false, false)],
                vec![SetTaint],
            ),
            (
                "not ready, already tainted",
                &cfg.helm,
                tainted(),
                json!([]),
                vec![pod(false, false)],
                vec![],
            ),
            (
                "only a deleting ready pod",
                &cfg.helm,
                plain(),
                up(),
                vec![pod(true, true)],
                vec![SetTaint],
            ),
            (
                "not ready, set-cilium-node-taints off",
                &cfg.flag_defaults,
                plain(),
                json!([]),
                vec![pod(false, false)],
                vec![],
            ),
            // No Cilium pod cached for the node: nothing, either way.
            (
                "no pod, tainted",
                &cfg.helm,
                tainted(),
                json!([]),
                vec![],
                vec![],
            ),
            (
                "no pod, untainted",
                &cfg.helm,
                plain(),
                json!([]),
                vec![],
                vec![],
            ),
            // registerNodeTaintSync: set-cilium-node-taints alone starts nothing.
            (
                "controller off",
                &cfg.only_set,
                plain(),
                json!([]),
                vec![pod(false, false)],
                vec![],
            ),
        ]
    }

    #[test]
    fn check_and_mark_node_table() {
        let cfg = configs();
        let cases = running_cases(&cfg)
            .into_iter()
            .chain(not_running_cases(&cfg));
        for (name, cfg, taints, conds, pods, want) in cases {
            let n = node(taints, conds);
            assert_eq!(check_and_mark_node(&n, &pods, cfg), want, "{name}");
        }
    }

    #[test]
    fn remove_node_taint_removes_every_taint_with_the_key() {
        let n = node(
            json!([
                {"key": KEY, "value": "true", "effect": "NoExecute"},
                {"key": "keep", "value": "v", "effect": "NoSchedule"},
                {"key": KEY, "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"},
            ]),
            json!([]),
        );
        assert_eq!(
            remove_node_taint(&n, KEY).unwrap(),
            json!([
                {"op": "test", "path": "/spec/taints", "value": [
                    {"key": KEY, "value": "true", "effect": "NoExecute"},
                    {"key": "keep", "value": "v", "effect": "NoSchedule"},
                    {"key": KEY, "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"},
                ]},
                {"op": "replace", "path": "/spec/taints", "value": [
                    {"key": "keep", "value": "v", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"},
                ]},
            ])
        );
        // The last one gone: replaced by null (a nil slice).
        let only = node(
            json!([{"key": KEY, "value": "", "effect": "NoSchedule"}]),
            json!([]),
        );
        assert_eq!(
            remove_node_taint(&only, KEY).unwrap(),
            json!([
                {"op": "test", "path": "/spec/taints", "value": [{"key": KEY, "effect": "NoSchedule"}]},
                {"op": "replace", "path": "/spec/taints", "value": null},
            ])
        );
        assert!(
            remove_node_taint(
                &node(json!([{"key": "keep", "effect": "NoSchedule"}]), json!([])),
                KEY
            )
            .is_none()
        );
        assert!(remove_node_taint(&node(Value::Null, json!([])), KEY).is_none());
    }

    #[test]
    fn set_node_taint_adds_key_no_schedule_without_value() {
        let n = node(
            json!([{"key": "keep", "value": "v", "effect": "NoExecute"}]),
            json!([]),
        );
        assert_eq!(
            set_node_taint(&n, KEY).unwrap(),
            json!([
                {"op": "test", "path": "/spec/taints", "value": [{"key": "keep", "value": "v", "effect": "NoExecute"}]},
                {"op": "replace", "path": "/spec/taints", "value": [
                    {"key": "keep", "value": "v", "effect": "NoExecute"},
                    {"key": KEY, "effect": "NoSchedule"},
                ]},
            ])
        );
        // No taints: the test is against null, as upstream sends it.
        assert_eq!(
            set_node_taint(&node(Value::Null, json!([])), KEY).unwrap(),
            json!([
                {"op": "test", "path": "/spec/taints", "value": null},
                {"op": "replace", "path": "/spec/taints", "value": [{"key": KEY, "effect": "NoSchedule"}]},
            ])
        );
        // Any taint with the key, whatever its effect, is enough.
        let other_effect = node(
            json!([{"key": KEY, "value": "true", "effect": "NoExecute"}]),
            json!([]),
        );
        assert!(set_node_taint(&other_effect, KEY).is_none());
    }

    #[test]
    fn condition_patch() {
        let n = node(Value::Null, json!([{"type": "Ready", "status": "True"}]));
        assert_eq!(
            set_network_unavailable_false(&n, &now()).unwrap(),
            json!({"status": {"conditions": [{
                "type": "NetworkUnavailable", "status": "False",
                "reason": "CiliumIsUp", "message": "Cilium is running on this node",
                "lastTransitionTime": "2026-01-02T03:04:05Z", "lastHeartbeatTime": "2026-01-02T03:04:05Z",
            }]}})
        );
        assert!(set_network_unavailable_false(&node(Value::Null, up()), &now()).is_none());
        // NetworkUnavailable=False from someone else (another reason) is not Cilium's.
        let other = node(
            Value::Null,
            json!([{"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]),
        );
        assert!(set_network_unavailable_false(&other, &now()).is_some());
    }

    #[test]
    fn decide_composes_steps_and_writes() {
        let helm = OperatorConfig::helm_defaults();
        let n = node(json!([{"key": KEY, "effect": "NoExecute"}]), up());
        // markNode(running): removeNodeTaint writes, the condition is there already.
        let w = decide(&n, &[pod(true, false)], &helm, &now());
        assert_eq!(actions(&w), vec![Action::RemoveTaint]);
        assert!(!w[0].is_status());
        let n = node(json!([{"key": "other", "effect": "NoSchedule"}]), json!([]));
        let w = decide(&n, &[pod(true, false)], &helm, &now());
        assert_eq!(actions(&w), vec![Action::SetCondition]);
        assert!(w[0].is_status());
        let w = decide(&n, &[pod(false, false)], &helm, &now());
        assert_eq!(actions(&w), vec![Action::SetTaint]);
        // A custom key is removed and added by that key only.
        let custom = OperatorConfig {
            taint_key: "example.com/cni".into(),
            ..helm
        };
        let n = node(json!([{"key": KEY, "effect": "NoSchedule"}]), up());
        let w = decide(&n, &[pod(false, false)], &custom, &now());
        assert_eq!(
            w[0].patch[1]["value"][1],
            json!({"key": "example.com/cni", "effect": "NoSchedule"})
        );
        assert!(decide(&n, &[pod(true, false)], &custom, &now()).is_empty());
    }
}
