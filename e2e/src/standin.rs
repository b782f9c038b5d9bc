//! A stand-in for the nodegate agent: once "the network agent is ready" it
//! removes nodegate's taints and records the bootID it was ready on, in one
//! guarded JSON patch — the write the webhook's reboot rule keys on.
//!
//! The webhook's end-to-end tests use it to play the agent's write at an
//! exact moment (the real agent decides its moments itself). `nodegate-sim`
//! runs the real agent logic instead (the `nodegate-sim` crate).

use futures::future::BoxFuture;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PatchParams};
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use nodegate_shared::{NodeView, TaintSpec};
use serde_json::{Value, json};

/// Marks a node's agent ready on the API server.
pub trait AgentReadiness: Send + Sync {
    fn mark_ready<'a>(
        &'a self,
        client: &'a kube::Client,
        node: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// The stand-in: removes `taints` (by key and effect) and sets the annotation.
#[derive(Debug, Clone)]
pub struct StandInAgent {
    pub taints: Vec<TaintSpec>,
}

impl Default for StandInAgent {
    fn default() -> Self {
        Self {
            taints: vec![
                nodegate_shared::keys::DEFAULT_TAINT
                    .parse()
                    .expect("the default taint is valid"),
            ],
        }
    }
}

/// The guarded patch: fails (422) if the node changed since `node` was read.
pub fn ready_patch(node: &Value, taints: &[TaintSpec]) -> anyhow::Result<Patch> {
    let view: NodeView = serde_json::from_value(node.clone())?;
    let boot = view
        .boot_id()
        .ok_or_else(|| anyhow::anyhow!("node has no bootID yet"))?
        .to_string();
    let rv = view.metadata.resource_version.clone().unwrap_or_default();
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
        value: json!(rv),
    })];
    let current = view.taints();
    // Remove from the end so earlier indices stay valid.
    for (i, t) in current.iter().enumerate().rev() {
        if taints.iter().any(|s| s.matches(t)) {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: PointerBuf::from_tokens([
                    "spec".to_string(),
                    "taints".to_string(),
                    i.to_string(),
                ]),
            }));
        }
    }
    if node
        .pointer("/metadata/annotations")
        .is_none_or(Value::is_null)
    {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: json!({}),
        }));
    }
    ops.push(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(["metadata", "annotations", READY_BOOT_ID_ANNOTATION]),
        value: json!(boot),
    }));
    Ok(Patch(ops))
}

impl AgentReadiness for StandInAgent {
    fn mark_ready<'a>(
        &'a self,
        client: &'a kube::Client,
        node: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let api: Api<Node> = Api::all(client.clone());
            let mut last = None;
            for _ in 0..10 {
                let n = serde_json::to_value(api.get(node).await?)?;
                let patch = ready_patch(&n, &self.taints)?;
                match api
                    .patch(
                        node,
                        &PatchParams::default(),
                        &kube::api::Patch::Json::<()>(patch),
                    )
                    .await
                {
                    Ok(_) => return Ok(()),
                    // The node moved on since it was read: read again.
                    Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => last = Some(s),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(anyhow::anyhow!("node {node} kept changing: {last:?}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_only_our_taints_and_records_boot() {
        let node = json!({"metadata": {"name": "n", "resourceVersion": "7"},
            "spec": {"taints": [
                {"key": "nodegate.dev/agent-not-ready", "value": "true", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
            "status": {"nodeInfo": {"bootID": "b1"}}});
        let p = ready_patch(&node, &StandInAgent::default().taints).unwrap();
        let mut out = node.clone();
        json_patch::patch(&mut out, &p).unwrap();
        assert_eq!(out["spec"]["taints"].as_array().unwrap().len(), 1);
        assert_eq!(
            out["metadata"]["annotations"][READY_BOOT_ID_ANNOTATION],
            "b1"
        );
        let mut moved = node.clone();
        moved["metadata"]["resourceVersion"] = json!("8");
        assert!(json_patch::patch(&mut moved, &p).is_err());
        assert!(ready_patch(&json!({"metadata": {}}), &[]).is_err());
    }
}
