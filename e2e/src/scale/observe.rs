//! What the scenarios assert, from watches of every Node and every Pod as
//! the admin sees them: each Node version with its resourceVersion (etcd's
//! revision, one counter for the whole cluster), whether it carries the
//! gate and its boot ID; each Pod's binding with its resourceVersion. A pod
//! bound while its node was gated is one whose binding revision falls
//! after a gated version of the node and before the next ungated one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

pub const GATE_KEY: &str = "nodegate.dev/agent-not-ready";

#[derive(Debug, Clone)]
pub struct NodeVersion {
    pub rv: u64,
    pub seen: Instant,
    pub gated: bool,
    pub boot_id: String,
}

#[derive(Debug, Clone)]
pub struct Binding {
    pub rv: u64,
    pub seen: Instant,
    pub node: String,
    /// The pod tolerates the gate (the agent's and the network agent's
    /// DaemonSet Pods tolerate every taint): its binding to a gated node is
    /// what the gate allows.
    pub tolerates_gate: bool,
}

#[derive(Debug, Default)]
pub struct Record {
    pub nodes: HashMap<String, Vec<NodeVersion>>,
    /// First version of each pod seen with a node, by uid.
    pub bindings: HashMap<String, Binding>,
}

pub type Shared = Arc<Mutex<Record>>;

fn rv(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub fn is_gated(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == GATE_KEY && t.effect == "NoSchedule")
        })
}

/// Starts both watches on a thread and runtime of their own, with a client
/// of their own: in the simulator's runtime they would queue behind 1,000
/// kubelets' and agents' tasks, and a figure read from them would measure
/// the simulator's backlog rather than the API server. They run until the
/// process ends.
pub fn start(admin: kube::Config) -> anyhow::Result<Shared> {
    let rec: Shared = Arc::default();
    let r = rec.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("observe".into())
        .spawn(move || {
            rt.block_on(async move {
                match Client::try_from(admin) {
                    Ok(client) => watch(client, r).await,
                    Err(e) => tracing::error!(error = %e, "observer client"),
                }
            })
        })?;
    Ok(rec)
}

async fn watch(admin: Client, rec: Shared) {
    let r = rec.clone();
    let nodes: Api<Node> = Api::all(admin.clone());
    let nodes = async move {
        let s = watcher(nodes, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let mut s = std::pin::pin!(s);
        while let Some(ev) = s.next().await {
            let Ok(node) = ev else { continue };
            let v = NodeVersion {
                rv: rv(&node.metadata),
                seen: Instant::now(),
                gated: is_gated(&node),
                boot_id: node
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.boot_id.clone())
                    .unwrap_or_default(),
            };
            tracing::debug!(node = %node.name_any(), rv = v.rv, gated = v.gated, "node version seen");
            let mut rec = r.lock().unwrap_or_else(|e| e.into_inner());
            let vs = rec.nodes.entry(node.name_any()).or_default();
            // A relist delivers versions already seen.
            if vs.last().is_none_or(|l| l.rv < v.rv) {
                vs.push(v);
            }
        }
    };
    let pods: Api<Pod> = Api::all(admin);
    let pods = async move {
        let s = watcher(pods, watcher::Config::default().fields("spec.nodeName!="))
            .default_backoff()
            .applied_objects();
        let mut s = std::pin::pin!(s);
        while let Some(ev) = s.next().await {
            let Ok(pod) = ev else { continue };
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let mut rec = rec.lock().unwrap_or_else(|e| e.into_inner());
            rec.bindings
                .entry(pod.uid().unwrap_or_default())
                .or_insert(Binding {
                    rv: rv(&pod.metadata),
                    seen: Instant::now(),
                    node,
                    tolerates_gate: tolerates_gate(&pod),
                });
        }
    };
    futures::join!(nodes, pods);
}

/// Was `node` gated at revision `at` (its latest version at or before it)?
pub fn gated_at(versions: &[NodeVersion], at: u64) -> bool {
    versions
        .iter()
        .rev()
        .find(|v| v.rv <= at)
        .is_some_and(|v| v.gated)
}

/// Does `pod` tolerate the gate's NoSchedule taint (as the scheduler's
/// `TaintToleration` plugin matches a toleration to a taint)?
pub fn tolerates_gate(pod: &Pod) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations.is_some_and(|ts| {
        ts.iter().any(|t| {
            let key = t.key.as_deref().unwrap_or("");
            let exists = t.operator.as_deref() == Some("Exists");
            let effect = t.effect.as_deref().unwrap_or("");
            let key_ok = if key.is_empty() {
                exists
            } else {
                key == GATE_KEY
            };
            let value_ok = exists || t.value.as_deref() == Some("true");
            key_ok && value_ok && (effect.is_empty() || effect == "NoSchedule")
        })
    })
}

/// Pods that do not tolerate the gate bound to a node while it was gated.
pub fn bound_while_gated(rec: &Record, since_rv: u64) -> Vec<String> {
    rec.bindings
        .iter()
        .filter(|(_, b)| b.rv > since_rv && !b.tolerates_gate)
        .filter(|(_, b)| rec.nodes.get(&b.node).is_some_and(|vs| gated_at(vs, b.rv)))
        .map(|(uid, b)| format!("{uid} on {}", b.node))
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
        let cases = [
            (serde_json::json!([{"operator": "Exists"}]), true),
            (
                serde_json::json!([{"key": GATE_KEY, "operator": "Exists"}]),
                true,
            ),
            (
                serde_json::json!([{"key": GATE_KEY, "value": "true", "effect": "NoSchedule"}]),
                true,
            ),
            (
                serde_json::json!([{"key": GATE_KEY, "value": "false"}]),
                false,
            ),
            (
                serde_json::json!([{"key": GATE_KEY, "operator": "Exists", "effect": "NoExecute"}]),
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
}
