//! The agent's reads and writes of its own Node: the patches
//! [`crate::node_patch`] builds, sent with re-reads on conflicts and failed
//! `test`s until a deadline, and the Events that tell humans.

use std::sync::Arc;
use std::time::Duration;

use json_patch::Patch;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch as KubePatch, PatchParams, PostParams};
use nodegate_shared::NodeView;
use nodegate_shared::patch::{Guard, add_taints};
use tokio::time::Instant;

use crate::metrics::{Metrics, Reason};
use crate::node_patch::{
    AddReason, Added, EventType, MarkReady, ReadyOutcome, open_patch, ready_patch, taints_to_add,
};
use crate::taint_set::TaintSet;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot read node {0}: {1}")]
    Decode(String, serde_json::Error),
    #[error("gave up on node {name} at the deadline; last error: {last}")]
    Deadline { name: String, last: String },
}

/// Reads and patches one Node, retrying conflicts and failed `test`s by
/// re-reading.
#[derive(Clone)]
pub struct NodeWriter {
    pub api: Api<Node>,
    pub name: String,
    /// What to remove and add; the gate's rules read the same set.
    pub taints: Arc<TaintSet>,
    pub metrics: Metrics,
}

/// The node changed between the read and the patch: a failed `test` or a
/// conflict.
fn moved(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 409 | 422))
}

/// A taint entry as flags spell it: `key=value:Effect` (`key:Effect`
/// without a value).
fn shown(t: &serde_json::Value) -> String {
    let field = |k: &str| t.get(k).and_then(serde_json::Value::as_str).unwrap_or("");
    match field("value") {
        "" => format!("{}:{}", field("key"), field("effect")),
        v => format!("{}={v}:{}", field("key"), field("effect")),
    }
}

fn retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => !matches!(s.code, 400 | 401 | 403 | 405 | 415),
        _ => true,
    }
}

impl NodeWriter {
    /// The client the node API uses (for the own Node's watch).
    pub fn client(&self) -> kube::Client {
        self.api.clone().into_client()
    }

    /// The node, plus the slim view the rules read.
    pub async fn read(&self) -> Result<(Node, NodeView), WriteError> {
        let node = self.api.get(&self.name).await?;
        let view = serde_json::to_value(&node)
            .and_then(serde_json::from_value::<NodeView>)
            .map_err(|e| WriteError::Decode(self.name.clone(), e))?;
        Ok((node, view))
    }

    /// Applies `build(view)` until it succeeds, nothing is left to do
    /// (`build` returns `None` on a fresh read) or `deadline` passes. The
    /// first attempt may start from `seen`, the node as the watch last
    /// delivered it, saving a read on the path that ungates a node: the
    /// patch's `test`s refuse it if that view is stale, and every retry
    /// re-reads. Returns what `build` said with the node the patch left,
    /// and the node as last seen (read, or as the patch left it).
    async fn patch_loop<T>(
        &self,
        deadline: Instant,
        mut seen: Option<NodeView>,
        mut build: impl FnMut(&NodeView) -> Option<(Patch, T)>,
    ) -> Result<(Option<(T, Node)>, NodeView), WriteError> {
        // A failed `test` (422) or a conflict (409) means the node changed
        // since it was read: read again at once, then back off from 10 ms
        // (the node is gated meanwhile). Anything else (an overloaded or
        // unreachable API server) backs off from 50 ms.
        let mut moved_backoff = Duration::ZERO;
        let mut backoff = Duration::from_millis(50);
        loop {
            let attempt = async {
                // A cached view with nothing to do proves nothing: read.
                let cached = seen.take().and_then(|v| build(&v).map(|b| (b, v)));
                let ((patch, out), _) = match cached {
                    Some(c) => c,
                    None => {
                        let (_, view) = self.read().await?;
                        match build(&view) {
                            Some(b) => (b, view),
                            None => return Ok((None, view)),
                        }
                    }
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
                    .map_err(|e| WriteError::Decode(self.name.clone(), e))?;
                Ok::<_, WriteError>((Some((out, patched)), after))
            };
            let (err, moved) = match attempt.await {
                Ok(r) => return Ok(r),
                Err(WriteError::Kube(e)) if retryable(&e) => (e.to_string(), moved(&e)),
                Err(e) => return Err(e),
            };
            let wait = if moved { moved_backoff } else { backoff };
            if Instant::now() + wait > deadline {
                return Err(WriteError::Deadline {
                    name: self.name.clone(),
                    last: err,
                });
            }
            tracing::debug!(node = %self.name, error = %err, "node patch failed, re-reading");
            tokio::time::sleep(wait).await;
            if moved {
                moved_backoff =
                    (moved_backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(2));
            } else {
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }

    /// Removes the configured taints and records the bootID, in one patch,
    /// starting from `seen` (the watched node) when it shows work to do.
    /// `outcome` is `None` when the node already had no taint and the
    /// bootID recorded, or when it now reports another boot than
    /// `expected_boot` (the probes passed on the previous boot).
    pub async fn mark_ready(
        &self,
        deadline: Instant,
        expected_boot: Option<&str>,
        seen: Option<NodeView>,
    ) -> Result<MarkReady, WriteError> {
        let all = self.taints.clone();
        self.mark_ready_of(&all, deadline, expected_boot, seen)
            .await
    }

    /// [`NodeWriter::mark_ready`] for `taints`: the writer's whole set, or
    /// the gates that opened while others still hold the node
    /// ([`TaintSet::of_gates`]), whose patch records no bootID.
    pub async fn mark_ready_of(
        &self,
        taints: &TaintSet,
        deadline: Instant,
        expected_boot: Option<&str>,
        seen: Option<NodeView>,
    ) -> Result<MarkReady, WriteError> {
        let (out, latest) = self
            .patch_loop(deadline, seen, |view| {
                if let (Some(want), Some(now)) = (expected_boot, view.boot_id())
                    && want != now
                {
                    return None;
                }
                let patch = ready_patch(view, taints)?;
                let removed = view
                    .taints()
                    .iter()
                    .filter(|t| taints.removes(t))
                    .cloned()
                    .collect();
                Some((
                    patch,
                    ReadyOutcome {
                        removed,
                        boot_id: view.boot_id().map(str::to_owned),
                        // Only this agent writes the annotation, so even a
                        // watched view that is a little stale has it right.
                        ready_boot_before: view.ready_boot_id().map(str::to_owned),
                        since_creation_ms: None,
                        uid: view.metadata.uid.clone(),
                    },
                ))
            })
            .await?;
        let out = out.map(|(mut o, patched)| {
            o.since_creation_ms = patched
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| Timestamp::now().as_millisecond() - t.0.as_millisecond());
            o
        });
        if out.as_ref().is_some_and(|o| !o.removed.is_empty()) {
            self.metrics.taint_removals.inc();
        }
        Ok(MarkReady {
            outcome: out,
            latest,
        })
    }

    /// On removal: removes every gate the ready patch removes, guarded the
    /// same way, on a fresh read. Returns the taints removed, as
    /// `key=value:Effect` (empty: none was on the node).
    pub async fn open(&self, deadline: Instant) -> Result<Vec<String>, WriteError> {
        let taints = &*self.taints;
        let (out, _) = self
            .patch_loop(deadline, None, |view| {
                let patch = open_patch(view, taints)?;
                let removed = view
                    .taints()
                    .iter()
                    .filter(|t| taints.removes(t))
                    .map(shown)
                    .collect::<Vec<_>>();
                Some((patch, removed))
            })
            .await?;
        Ok(out.map(|(removed, _)| removed).unwrap_or_default())
    }

    /// Adds the missing configured taints (guarded by a `test` of the list
    /// read) that [`taints_to_add`] picks for `reason` on a fresh read.
    pub async fn add_missing(
        &self,
        reason: AddReason,
        deadline: Instant,
    ) -> Result<Added, WriteError> {
        let all = self.taints.clone();
        self.add_missing_of(&all, reason, deadline).await
    }

    /// [`NodeWriter::add_missing`] out of `set`: the writer's whole set, or
    /// the gates whose probes failed past the threshold.
    pub async fn add_missing_of(
        &self,
        set: &TaintSet,
        reason: AddReason,
        deadline: Instant,
    ) -> Result<Added, WriteError> {
        let (taints, latest) = self
            .patch_loop(deadline, None, |view| {
                let missing = taints_to_add(reason, view, set);
                if missing.is_empty() {
                    return None;
                }
                let keys = missing.iter().map(ToString::to_string).collect::<Vec<_>>();
                Some((add_taints(view, &missing, Guard::Current), keys))
            })
            .await?;
        let taints = taints.map(|(t, _)| t).unwrap_or_default();
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
