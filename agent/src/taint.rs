//! The writes the agent makes on its own Node: the "ready" patch that
//! removes the taint and records the bootID, re-adding the taint, and the
//! Event that tells humans.

use std::time::Duration;

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch as KubePatch, PatchParams, PostParams};
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use nodegate_shared::patch::{Guard, add_taints};
use nodegate_shared::{NodeView, TaintSpec};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::metrics::{Metrics, Reason};

/// The one patch that makes the node schedulable: for each configured taint
/// present, `test` the entry at its index then `remove` it (highest index
/// first, so earlier indices stay valid), and set the ready-boot-id
/// annotation to the node's current bootID. `None` when there is nothing to do.
///
/// The `test`s make the patch fail (HTTP 422) if the taint list moved since
/// it was read; other taints are never touched.
pub fn ready_patch(node: &NodeView, specs: &[TaintSpec]) -> Option<Patch> {
    let mut ops = Vec::new();
    for (i, taint) in node.taints().iter().enumerate().rev() {
        if specs.iter().any(|s| s.matches(taint)) {
            let path =
                PointerBuf::from_tokens(["spec".to_string(), "taints".into(), i.to_string()]);
            ops.push(PatchOperation::Test(TestOperation {
                path: path.clone(),
                value: taint.clone(),
            }));
            ops.push(PatchOperation::Remove(RemoveOperation { path }));
        }
    }
    if let Some(boot) = node.boot_id()
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

/// True when the node carries any configured taint or has not recorded its
/// current bootID as ready: the ready patch has work to do.
pub fn needs_ready_patch(node: &NodeView, specs: &[TaintSpec]) -> bool {
    ready_patch(node, specs).is_some()
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
pub fn safety_net_applies(node: &NodeView, specs: &[TaintSpec]) -> bool {
    !node.missing(specs).is_empty() && node.ready_boot_id() != node.boot_id()
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

/// What [`NodeTaints::add_missing`] did, and the node as it left it.
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

#[derive(Debug, thiserror::Error)]
pub enum TaintError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot read node {0}: {1}")]
    Decode(String, serde_json::Error),
    #[error("gave up on node {name} at the deadline; last error: {last}")]
    Deadline { name: String, last: String },
}

/// Result of a successful ready patch.
#[derive(Debug, Clone)]
pub struct ReadyOutcome {
    /// Taint entries removed (empty if someone else had removed them).
    pub removed: Vec<Value>,
    pub boot_id: Option<String>,
    pub created: Option<Time>,
    pub uid: Option<String>,
}

/// What [`NodeTaints::mark_ready`] did, and the node as it left it (so the
/// caller need not read it again).
#[derive(Debug, Clone)]
pub struct MarkReady {
    pub outcome: Option<ReadyOutcome>,
    pub latest: NodeView,
}

/// Reads and patches one Node, retrying conflicts and failed `test`s by
/// re-reading.
#[derive(Clone)]
pub struct NodeTaints {
    pub api: Api<Node>,
    pub name: String,
    pub specs: Vec<TaintSpec>,
    pub metrics: Metrics,
}

fn retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => !matches!(s.code, 400 | 401 | 403 | 405 | 415),
        _ => true,
    }
}

impl NodeTaints {
    /// The node, plus the slim view the rules read.
    pub async fn read(&self) -> Result<(Node, NodeView), TaintError> {
        let node = self.api.get(&self.name).await?;
        let view = serde_json::to_value(&node)
            .and_then(serde_json::from_value::<NodeView>)
            .map_err(|e| TaintError::Decode(self.name.clone(), e))?;
        Ok((node, view))
    }

    /// Re-reads and applies `build(view)` until it succeeds, nothing is left
    /// to do (`build` returns `None`) or `deadline` passes. Also returns the
    /// node as last seen (read, or as the patch left it).
    async fn patch_loop<T>(
        &self,
        deadline: Instant,
        mut build: impl FnMut(&Node, &NodeView) -> Option<(Patch, T)>,
    ) -> Result<(Option<T>, NodeView), TaintError> {
        let mut backoff = Duration::from_millis(50);
        loop {
            let attempt = async {
                let (node, view) = self.read().await?;
                let Some((patch, out)) = build(&node, &view) else {
                    return Ok((None, view));
                };
                let patched = self
                    .api
                    .patch(
                        &self.name,
                        &PatchParams::default(),
                        &KubePatch::Json::<()>(patch),
                    )
                    .await?;
                let after = serde_json::to_value(&patched)
                    .and_then(serde_json::from_value::<NodeView>)
                    .map_err(|e| TaintError::Decode(self.name.clone(), e))?;
                Ok::<_, TaintError>((Some(out), after))
            };
            let err = match attempt.await {
                Ok(r) => return Ok(r),
                Err(TaintError::Kube(e)) if retryable(&e) => e.to_string(),
                Err(e) => return Err(e),
            };
            if Instant::now() + backoff > deadline {
                return Err(TaintError::Deadline {
                    name: self.name.clone(),
                    last: err,
                });
            }
            tracing::debug!(node = %self.name, error = %err, "node patch failed, re-reading");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Removes the configured taints and records the bootID, in one patch.
    /// `outcome` is `None` when the node already had no taint and the
    /// bootID recorded, or when it now reports another boot than
    /// `expected_boot` (the probes passed on the previous boot).
    pub async fn mark_ready(
        &self,
        deadline: Instant,
        expected_boot: Option<&str>,
    ) -> Result<MarkReady, TaintError> {
        let specs = self.specs.clone();
        let (out, latest) = self
            .patch_loop(deadline, |node, view| {
                if let (Some(want), Some(now)) = (expected_boot, view.boot_id())
                    && want != now
                {
                    return None;
                }
                let patch = ready_patch(view, &specs)?;
                let removed = view
                    .taints()
                    .iter()
                    .filter(|t| specs.iter().any(|s| s.matches(t)))
                    .cloned()
                    .collect();
                Some((
                    patch,
                    ReadyOutcome {
                        removed,
                        boot_id: view.boot_id().map(str::to_owned),
                        created: node.metadata.creation_timestamp.clone(),
                        uid: node.metadata.uid.clone(),
                    },
                ))
            })
            .await?;
        if out.as_ref().is_some_and(|o| !o.removed.is_empty()) {
            self.metrics.taint_removals.inc();
        }
        Ok(MarkReady {
            outcome: out,
            latest,
        })
    }

    /// Adds the missing configured taints (guarded by a `test` of the list
    /// read) when `rule` holds on a fresh read.
    pub async fn add_missing(
        &self,
        reason: AddReason,
        deadline: Instant,
        rule: impl Fn(&NodeView) -> bool,
    ) -> Result<Added, TaintError> {
        let specs = self.specs.clone();
        let (taints, latest) = self
            .patch_loop(deadline, |_, view| {
                if !rule(view) {
                    return None;
                }
                let missing = view.missing(&specs);
                if missing.is_empty() {
                    return None;
                }
                let keys = missing.iter().map(ToString::to_string).collect::<Vec<_>>();
                Some((add_taints(view, &missing, Guard::Current), keys))
            })
            .await?;
        let taints = taints.unwrap_or_default();
        if !taints.is_empty() {
            self.metrics
                .taint_adds
                .get_or_create(&Reason {
                    reason: reason.as_str().into(),
                })
                .inc();
            tracing::info!(node = %self.name, reason = reason.as_str(), ?taints, "taint added");
        }
        Ok(Added { taints, latest })
    }

    /// Records a core/v1 Event on the Node (namespace `default`, as the
    /// kubelet does). Best effort: a failure is only logged.
    pub async fn event(&self, uid: Option<String>, kind: EventType, reason: &str, message: String) {
        let now = Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    self.name,
                    now.as_nanosecond().unsigned_abs()
                )),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.name.clone()),
                uid,
                ..ObjectReference::default()
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(
                match kind {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            source: Some(EventSource {
                component: Some("nodegate-agent".into()),
                host: Some(self.name.clone()),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some("nodegate-agent".into()),
            reporting_instance: Some(self.name.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.api.clone().into_client(), "default");
        if let Err(e) = api.create(&PostParams::default(), &ev).await {
            tracing::warn!(node = %self.name, error = %e, "cannot record event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<TaintSpec> {
        vec![
            "node.cilium.io/agent-not-ready=true:NoSchedule"
                .parse()
                .unwrap(),
        ]
    }

    fn view(v: Value) -> NodeView {
        serde_json::from_value(v).unwrap()
    }

    const OURS: &str =
        r#"{"key":"node.cilium.io/agent-not-ready","value":"true","effect":"NoSchedule"}"#;

    fn ours() -> Value {
        serde_json::from_str(OURS).unwrap()
    }

    #[test]
    fn ready_patch_tests_removes_and_records_boot_id() {
        let other = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
        let node = json!({
            "metadata": {"name": "n", "resourceVersion": "9", "annotations": {"a": "b"}},
            "spec": {"taints": [other, ours()]},
            "status": {"nodeInfo": {"bootID": "boot-1"}}
        });
        let patch = ready_patch(&view(node.clone()), &specs()).unwrap();
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
        assert!(ready_patch(&view(doc), &specs()).is_none());
    }

    #[test]
    fn ready_patch_adds_annotations_map_when_absent() {
        let node = json!({"metadata": {"name": "n", "resourceVersion": "3"},
                          "spec": {"taints": [ours()]},
                          "status": {"nodeInfo": {"bootID": "b"}}});
        let patch = ready_patch(&view(node.clone()), &specs()).unwrap();
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
        let patch = ready_patch(&read, &specs()).unwrap();
        let mut moved = json!({"metadata": {"annotations": {"x": "y"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}, ours()]}});
        assert!(json_patch::patch(&mut moved, &patch).is_err());
    }

    #[test]
    fn safety_net_rule() {
        let s = specs();
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
