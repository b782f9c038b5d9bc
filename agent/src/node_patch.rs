//! The writes the agent makes on its own Node, decided without I/O: the
//! "ready" patch that removes the taint and records the bootID, when the
//! taint is added back and why, and what a write reports.
//! `node_writer` sends them.

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use jsonptr::PointerBuf;
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use nodegate_shared::node::rebooted_since_ready;
use nodegate_shared::{NodeView, TaintSpec};
use serde_json::{Value, json};

use crate::taint_set::TaintSet;

/// The one patch that makes the node schedulable: for each configured or
/// released taint present, `test` the entry at its index then `remove` it
/// (highest index first, so earlier indices stay valid), and set the
/// ready-boot-id annotation to the node's current bootID. `None` when there
/// is nothing to do.
///
/// The `test`s make the patch fail (HTTP 422) if the taint list moved since
/// it was read; other taints are never touched.
pub fn ready_patch(node: &NodeView, taints: &TaintSet) -> Option<Patch> {
    let mut ops = removals(node, taints);
    // Only the set of every gate says the node is ready on this boot.
    if let Some(boot) = node.boot_id().filter(|_| taints.complete())
        && node.ready_boot_id() != Some(boot)
    {
        if node.metadata.annotations.is_empty() {
            // Replacing the whole map: guard against annotations added since
            // the read (an empty view may also mean `annotations` is absent).
            if let Some(rv) = &node.metadata.resource_version {
                ops.push(PatchOperation::Test(TestOperation {
                    path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
                    value: Value::String(rv.clone()),
                }));
            }
            ops.push(PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "annotations"]),
                value: json!({ READY_BOOT_ID_ANNOTATION: boot }),
            }));
        } else {
            ops.push(PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens([
                    "metadata",
                    "annotations",
                    READY_BOOT_ID_ANNOTATION,
                ]),
                value: Value::String(boot.to_owned()),
            }));
        }
    }
    (!ops.is_empty()).then_some(Patch(ops))
}

/// The ready patch's `test` and `remove` of each configured or released
/// taint present, highest index first.
fn removals(node: &NodeView, taints: &TaintSet) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    for (i, taint) in node.taints().iter().enumerate().rev() {
        if taints.removes(taint) {
            let path =
                PointerBuf::from_tokens(["spec".to_string(), "taints".into(), i.to_string()]);
            ops.push(PatchOperation::Test(TestOperation {
                path: path.clone(),
                value: taint.clone(),
            }));
            ops.push(PatchOperation::Remove(RemoveOperation { path }));
        }
    }
    ops
}

/// The patch that opens the node when nodegate is being removed: the ready
/// patch's guarded removals of every configured, boot and released taint,
/// without recording the bootID. The annotation says the network agent was
/// ready on this boot; on a node still waiting for it that would be false,
/// and a later install's safety net would trust it and leave the node
/// open. `None` when no gate is on the node.
pub fn open_patch(node: &NodeView, taints: &TaintSet) -> Option<Patch> {
    let ops = removals(node, taints);
    (!ops.is_empty()).then_some(Patch(ops))
}

/// True when the node carries any configured or released taint or has not
/// recorded its current bootID as ready: the ready patch has work to do.
pub fn needs_ready_patch(node: &NodeView, taints: &TaintSet) -> bool {
    ready_patch(node, taints).is_some()
}

/// Why the agent adds its taint back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddReason {
    /// At start: not ready, taint missing, bootID not recorded as ready
    /// (the webhook was down when the node registered or rebooted).
    SafetyNet,
    /// SIGTERM: the node may be going down; it must come back tainted.
    Shutdown,
    /// `--continuous`: probes failed past the failure threshold.
    Continuous,
}

impl AddReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AddReason::SafetyNet => "safety_net",
            AddReason::Shutdown => "shutdown",
            AddReason::Continuous => "continuous",
        }
    }
}

/// The safety-net rule, evaluated on a fresh read.
pub fn safety_net_applies(node: &NodeView, taints: &TaintSet) -> bool {
    !node.missing(taints.managed()).is_empty() && node.ready_boot_id() != node.boot_id()
}

/// Who put on the taint a ready patch removes: the label of
/// `nodegate_agent_time_to_ready_seconds`, so a dashboard shows a webhook
/// that silently stopped acting (the safety net's share grows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Already on when the agent looked: the webhook (at create, or its
    /// reboot patch), or this agent's own shutdown re-taint before a restart
    /// on the same boot.
    Webhook,
    /// The agent's start-up safety net: the webhook missed the node.
    SafetyNet,
    /// The agent's `--continuous` re-taint after its probes failed.
    Continuous,
    /// Nothing gated this boot: the ready patch removed no taint and only
    /// recorded the bootID (e.g. a reboot the webhook missed while the agent
    /// kept running).
    None,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Webhook => "webhook",
            Origin::SafetyNet => "safety_net",
            Origin::Continuous => "continuous",
            Origin::None => "none",
        }
    }
}

/// The taints the agent adds for `reason` to `node` as freshly read, out of
/// the ones it manages. The safety net acts only when the webhook missed
/// this boot; the shutdown and continuous re-taints always. The boot gate
/// evicts, so it comes only with a boot other than the one the node
/// recorded as ready: never on the same boot (an agent rollout or a probe
/// failure), and never on a node without a recorded boot (nodegate
/// installed on a running cluster), where it would evict what already runs
/// there.
pub fn taints_to_add<'a>(
    reason: AddReason,
    node: &NodeView,
    taints: &'a TaintSet,
) -> Vec<&'a TaintSpec> {
    let applies = match reason {
        AddReason::SafetyNet => safety_net_applies(node, taints),
        AddReason::Shutdown | AddReason::Continuous => true,
    };
    if !applies {
        return Vec::new();
    }
    let new_boot = reason == AddReason::SafetyNet
        && rebooted_since_ready(node.ready_boot_id(), node.boot_id());
    node.missing(taints.managed())
        .into_iter()
        .filter(|s| new_boot || !taints.boot().contains(s))
        .collect()
}

/// What `NodeWriter::add_missing` did, and the node as it left it.
#[derive(Debug, Clone)]
pub struct Added {
    /// The taints added, as `key=value:Effect` (empty: nothing to do).
    pub taints: Vec<String>,
    pub latest: NodeView,
}

/// Event type, as core/v1 Events spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// Result of a successful ready patch.
#[derive(Debug, Clone)]
pub struct ReadyOutcome {
    /// Taint entries removed (empty if someone else had removed them).
    pub removed: Vec<Value>,
    pub boot_id: Option<String>,
    /// The bootID the node had recorded as ready before this patch (`None`:
    /// its first ready, as far as the annotation tells).
    pub ready_boot_before: Option<String>,
    /// Milliseconds from the Node's creation to the patch, when known.
    pub since_creation_ms: Option<i64>,
    pub uid: Option<String>,
}

/// What `NodeWriter::mark_ready` did, and the node as it left it (so the
/// caller need not read it again).
#[derive(Debug, Clone)]
pub struct MarkReady {
    pub outcome: Option<ReadyOutcome>,
    /// With an outcome, the patch's answer: the version right after the
    /// untaint, whose labels and other taints were there before it.
    pub latest: NodeView,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<TaintSpec> {
        vec![
            "nodegate.dev/agent-not-ready=true:NoSchedule"
                .parse()
                .unwrap(),
        ]
    }

    /// The default gate, releasing `release`.
    fn taints(release: &[TaintSpec]) -> TaintSet {
        TaintSet::new(specs(), Vec::new(), release.to_vec())
    }

    fn view(v: Value) -> NodeView {
        serde_json::from_value(v).unwrap()
    }

    const OURS: &str =
        r#"{"key":"nodegate.dev/agent-not-ready","value":"true","effect":"NoSchedule"}"#;

    fn ours() -> Value {
        serde_json::from_str(OURS).unwrap()
    }

    /// The API server's TaintNodesByCondition puts `not-ready` on every Node
    /// at create, before any webhook, and the node lifecycle controller
    /// takes it off the moment the node turns ready: just when the agent's
    /// ready patch goes out, built from the version it watched. The gate is
    /// added in front, so that removal does not move it and the patch's
    /// `test` holds; behind `not-ready` it would fail and cost a read and a
    /// second patch.
    #[test]
    fn a_ready_patch_survives_the_removal_of_a_taint_added_at_create() {
        let not_ready = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
        let created = json!({
            "metadata": {"name": "n", "annotations": {"a": "b"}},
            "spec": {"taints": [not_ready]},
            "status": {"nodeInfo": {"bootID": "boot-1"}}
        });
        let spec = taints(&[]);
        let missing: Vec<&TaintSpec> = spec.managed().iter().collect();
        let gate = nodegate_shared::patch::add_taints(
            &view(created.clone()),
            &missing,
            nodegate_shared::patch::Guard::None,
        );
        let mut watched = created;
        json_patch::patch(&mut watched, &gate).unwrap();
        let patch = ready_patch(&view(watched.clone()), &spec).unwrap();
        // The controller's write lands first.
        let mut stored = watched.clone();
        stored["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["key"] != "node.kubernetes.io/not-ready");
        json_patch::patch(&mut stored, &patch).expect("the ready patch still applies");
        assert_eq!(stored["spec"]["taints"], json!([]));
        assert_eq!(
            stored["metadata"]["annotations"][READY_BOOT_ID_ANNOTATION],
            "boot-1"
        );
        // Behind it, the same race fails the `test`.
        let mut behind = watched;
        behind["spec"]["taints"] = json!([not_ready, ours()]);
        let late = ready_patch(&view(behind.clone()), &spec).unwrap();
        behind["spec"]["taints"] = json!([ours()]);
        assert!(json_patch::patch(&mut behind, &late).is_err());
    }

    #[test]
    fn ready_patch_tests_removes_and_records_boot_id() {
        let other = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
        let node = json!({
            "metadata": {"name": "n", "resourceVersion": "9", "annotations": {"a": "b"}},
            "spec": {"taints": [other, ours()]},
            "status": {"nodeInfo": {"bootID": "boot-1"}}
        });
        let patch = ready_patch(&view(node.clone()), &taints(&[])).unwrap();
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "test", "path": "/spec/taints/1", "value": ours()},
                {"op": "remove", "path": "/spec/taints/1"},
                {"op": "add", "path": "/metadata/annotations/nodegate.dev~1ready-boot-id", "value": "boot-1"}
            ])
        );
        let mut doc = node;
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["spec"]["taints"], json!([other]));
        assert_eq!(
            doc["metadata"]["annotations"]["nodegate.dev/ready-boot-id"],
            "boot-1"
        );
        assert_eq!(doc["metadata"]["annotations"]["a"], "b");
        // Applied once, nothing is left to do.
        assert!(ready_patch(&view(doc), &taints(&[])).is_none());
    }

    /// Upgrades: the old default taint goes with the ready patch, matched
    /// exactly; the taint Cilium's operator keeps under the same key (empty
    /// value) and any other effect stay.
    #[test]
    fn ready_patch_releases_only_exact_matches() {
        let legacy: TaintSpec = nodegate_shared::keys::LEGACY_TAINT.parse().unwrap();
        let old = json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
        let operators = json!({"key": "node.cilium.io/agent-not-ready", "effect": "NoSchedule"});
        let registered = json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoExecute"});
        let node = json!({
            "metadata": {"name": "n", "annotations": {"nodegate.dev/ready-boot-id": "b"}},
            "spec": {"taints": [operators, old, registered]},
            "status": {"nodeInfo": {"bootID": "b"}}
        });
        let release = taints(std::slice::from_ref(&legacy));
        assert!(needs_ready_patch(&view(node.clone()), &release));
        let patch = ready_patch(&view(node.clone()), &release).unwrap();
        let mut doc = node.clone();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["spec"]["taints"], json!([operators, registered]));
        assert!(!needs_ready_patch(&view(doc), &release));
        // Without the flag nothing of another key is touched.
        assert!(ready_patch(&view(node), &taints(&[])).is_none());
    }

    #[test]
    fn ready_patch_adds_annotations_map_when_absent() {
        let node = json!({"metadata": {"name": "n", "resourceVersion": "3"},
                          "spec": {"taints": [ours()]},
                          "status": {"nodeInfo": {"bootID": "b"}}});
        let patch = ready_patch(&view(node.clone()), &taints(&[])).unwrap();
        let mut doc = node;
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["spec"]["taints"], json!([]));
        assert_eq!(
            doc["metadata"]["annotations"],
            json!({"nodegate.dev/ready-boot-id": "b"})
        );
    }

    #[test]
    fn ready_patch_fails_when_taints_moved() {
        let read = view(json!({"metadata": {"annotations": {"x": "y"}},
                               "spec": {"taints": [ours()]}}));
        let patch = ready_patch(&read, &taints(&[])).unwrap();
        let mut moved = json!({"metadata": {"annotations": {"x": "y"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}, ours()]}});
        assert!(json_patch::patch(&mut moved, &patch).is_err());
    }

    /// On removal every gate the ready patch removes goes (the boot gate
    /// and a released taint too), guarded the same way; others stay, and
    /// the node is not recorded as ready.
    #[test]
    fn the_open_patch_removes_every_gate_and_records_nothing() {
        let boot: TaintSpec = "nodegate.dev/agent-not-ready=true:NoExecute"
            .parse()
            .unwrap();
        let legacy: TaintSpec = nodegate_shared::keys::LEGACY_TAINT.parse().unwrap();
        let set = TaintSet::new(specs(), vec![boot], vec![legacy]);
        let other = json!({"key": "example.com/dedicated", "effect": "NoSchedule"});
        let node = json!({
            "metadata": {"name": "n", "annotations": {"nodegate.dev/ready-boot-id": "b0"}},
            "spec": {"taints": [
                ours(),
                other,
                {"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoExecute"},
                {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"},
            ]},
            "status": {"nodeInfo": {"bootID": "b1"}}
        });
        let patch = open_patch(&view(node.clone()), &set).unwrap();
        let mut doc = node.clone();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["spec"]["taints"], json!([other]));
        assert_eq!(
            doc["metadata"]["annotations"],
            json!({"nodegate.dev/ready-boot-id": "b0"}),
            "the bootID is not recorded as ready"
        );
        assert!(open_patch(&view(doc), &set).is_none(), "nothing left");
        // A moved list fails the `test`s, as the ready patch's does.
        let mut moved = node;
        moved["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"key": "k", "effect": "NoSchedule"}));
        assert!(json_patch::patch(&mut moved, &patch).is_err());
    }

    #[test]
    fn only_the_safety_net_depends_on_the_node() {
        let s = taints(&[]);
        let ready = view(
            json!({"metadata": {"annotations": {"nodegate.dev/ready-boot-id": "b"}},
                                "status": {"nodeInfo": {"bootID": "b"}}}),
        );
        assert!(taints_to_add(AddReason::SafetyNet, &ready, &s).is_empty());
        assert_eq!(taints_to_add(AddReason::Shutdown, &ready, &s).len(), 1);
        assert_eq!(taints_to_add(AddReason::Continuous, &ready, &s).len(), 1);
    }

    /// Strict mode: the boot gate comes only with a new boot, from the
    /// safety net; every other re-taint adds the ordinary taint alone.
    #[test]
    fn the_boot_gate_is_added_only_on_a_boot_not_recorded_as_ready() {
        let gate: TaintSpec = "nodegate.dev/agent-not-ready=true:NoExecute"
            .parse()
            .unwrap();
        let all = TaintSet::new(specs(), vec![gate], Vec::new());
        let on = |ready: Option<&str>| {
            let ann = ready.map_or(json!({}), |r| json!({"nodegate.dev/ready-boot-id": r}));
            view(
                json!({"metadata": {"annotations": ann}, "status": {"nodeInfo": {"bootID": "b2"}}}),
            )
        };
        let shown = |v: Vec<&TaintSpec>| v.iter().map(|t| t.effect().as_str()).collect::<Vec<_>>();
        // (reason, recorded ready boot, effects added)
        let cases: [(AddReason, Option<&str>, &[&str]); 6] = [
            (
                AddReason::SafetyNet,
                Some("b1"),
                &["NoSchedule", "NoExecute"],
            ),
            (AddReason::SafetyNet, Some("b2"), &[]),
            (AddReason::SafetyNet, None, &["NoSchedule"]),
            (AddReason::Shutdown, Some("b1"), &["NoSchedule"]),
            (AddReason::Shutdown, Some("b2"), &["NoSchedule"]),
            (AddReason::Continuous, Some("b2"), &["NoSchedule"]),
        ];
        for (reason, ready, want) in cases {
            let got = shown(taints_to_add(reason, &on(ready), &all));
            assert_eq!(got, want, "{reason:?} with ready boot {ready:?}");
        }
    }

    #[test]
    fn safety_net_rule() {
        let s = taints(&[]);
        // No taint, no annotation: webhook missed it.
        assert!(safety_net_applies(
            &view(json!({"status": {"nodeInfo": {"bootID": "b"}}})),
            &s
        ));
        // Already ready on this boot (agent restart without reboot).
        assert!(!safety_net_applies(
            &view(
                json!({"metadata": {"annotations": {"nodegate.dev/ready-boot-id": "b"}},
                         "status": {"nodeInfo": {"bootID": "b"}}})
            ),
            &s
        ));
        // Rebooted since ready.
        assert!(safety_net_applies(
            &view(
                json!({"metadata": {"annotations": {"nodegate.dev/ready-boot-id": "a"}},
                         "status": {"nodeInfo": {"bootID": "b"}}})
            ),
            &s
        ));
        // Taint present: nothing to add.
        assert!(!safety_net_applies(
            &view(json!({"spec": {"taints": [ours()]}})),
            &s
        ));
    }
}
