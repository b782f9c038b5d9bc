//! A taint-eviction controller to run against the emulator (or any API
//! server) next to simulated kubelets: it watches Nodes and Pods and deletes
//! pods as [`crate::taint_eviction::plan`] decides.
//!
//! Upstream (kubernetes v1.36) `pkg/controller/tainteviction/taint_eviction.go`:
//! `New` (pod and node informers), `Run`, `deletePodHandler` and
//! `addConditionAndDeletePod` (a `DisruptionTarget` condition with reason
//! `DeletionByTaintManager`, then a plain delete). Not modelled: the
//! `TaintManagerEviction` events, the metrics, and the 5 retries of a
//! failed deletion (one attempt, logged).
//!
//! Cost: two watches (all Nodes, all Pods) on one client, and one
//! [`plan`](crate::taint_eviction::plan) pass over the cached pods per batch
//! of watch events — a few microseconds for a few hundred pods.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::taint_eviction::{BoundPod, PodKey, Queue, plan};
use crate::tolerations::COMPARISON_OPERATORS_DEFAULT;
use crate::util;

/// A pod this controller deleted, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub pod: PodKey,
    pub node: String,
    pub at: Instant,
}

type Evictions = Arc<Mutex<Vec<Eviction>>>;

/// The running controller; [`stop`](Self::stop) ends it.
pub struct TaintEvictionController {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    evictions: Evictions,
}

impl std::fmt::Debug for TaintEvictionController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaintEvictionController")
            .finish_non_exhaustive()
    }
}

impl TaintEvictionController {
    /// Starts it with `client` (it needs to watch Nodes and Pods, patch
    /// `pods/status` and delete pods: the admin, say).
    pub fn start(client: kube::Client) -> Self {
        let (stop, stopped) = oneshot::channel();
        let evictions = Evictions::default();
        let task = tokio::spawn(run(client, stopped, evictions.clone()));
        Self {
            stop: Some(stop),
            task,
            evictions,
        }
    }

    /// Every pod deleted so far, in order.
    pub fn evictions(&self) -> Vec<Eviction> {
        self.evictions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for TaintEvictionController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The informers' state as `plan` takes it; pods this controller already
/// deleted are left out until the watch drops them (upstream's queue item
/// is gone after it fired, and the deletion changes no toleration).
fn snapshot(
    nodes: &Store<Node>,
    pods: &Store<Pod>,
    deleted: &HashSet<String>,
) -> (
    BTreeMap<String, Vec<k8s_openapi::api::core::v1::Taint>>,
    Vec<BoundPod>,
) {
    let nodes = nodes
        .state()
        .iter()
        .filter_map(|n| {
            let taints = n.spec.as_ref().and_then(|s| s.taints.clone());
            Some((n.metadata.name.clone()?, taints.unwrap_or_default()))
        })
        .collect();
    let pods = pods
        .state()
        .iter()
        .filter(|p| !p.metadata.uid.as_ref().is_some_and(|u| deleted.contains(u)))
        .filter_map(|p| {
            let spec = p.spec.as_ref()?;
            Some(BoundPod {
                key: PodKey {
                    namespace: p.metadata.namespace.clone().unwrap_or_default(),
                    name: p.metadata.name.clone()?,
                },
                node: spec.node_name.clone().unwrap_or_default(),
                tolerations: spec.tolerations.clone().unwrap_or_default(),
            })
        })
        .collect();
    (nodes, pods)
}

async fn run(client: kube::Client, mut stopped: oneshot::Receiver<()>, evictions: Evictions) {
    let (nodes, node_writer) = reflector::store::<Node>();
    let (pods, pod_writer) = reflector::store::<Pod>();
    // Which informer finished its initial list (upstream waits for both).
    #[derive(Clone, Copy)]
    enum Synced {
        Nodes,
        Pods,
        Neither,
    }
    let node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .map(|e| match e {
            Ok(watcher::Event::InitDone) => Synced::Nodes,
            _ => Synced::Neither,
        });
    let pod_events = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(pod_writer)
        .map(|e| match e {
            Ok(watcher::Event::InitDone) => Synced::Pods,
            _ => Synced::Neither,
        });
    let mut events = std::pin::pin!(futures::stream::select(node_events, pod_events));
    let (mut nodes_synced, mut pods_synced) = (false, false);
    let mut queue = Queue::new();
    let mut next_due: Option<Instant> = None;
    let mut deleted: HashSet<String> = HashSet::new();
    loop {
        let due = async {
            match next_due {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        let mut batch = Vec::new();
        tokio::select! {
            _ = &mut stopped => return,
            e = events.next() => match e {
                Some(e) => batch.push(e),
                None => return,
            },
            () = due => {}
        }
        // One pass for everything already delivered.
        while let Some(Some(e)) = events.next().now_or_never() {
            batch.push(e);
        }
        for e in batch {
            match e {
                Synced::Nodes => nodes_synced = true,
                Synced::Pods => pods_synced = true,
                Synced::Neither => {}
            }
        }
        if !(nodes_synced && pods_synced) {
            continue;
        }
        let (node_taints, bound) = snapshot(&nodes, &pods, &deleted);
        let now = Instant::now();
        let p = plan(
            &node_taints,
            &bound,
            &queue,
            now,
            COMPARISON_OPERATORS_DEFAULT,
        );
        queue = p.queue;
        next_due = p.next_due;
        for key in p.delete {
            let node = bound
                .iter()
                .find(|b| b.key == key)
                .map(|b| b.node.clone())
                .unwrap_or_default();
            match delete_pod(&client, &key).await {
                Ok(uid) => {
                    deleted.extend(uid);
                    evictions
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Eviction {
                            pod: key,
                            node,
                            at: Instant::now(),
                        });
                }
                Err(e) => tracing::warn!(pod = %key, error = %e, "taint eviction failed"),
            }
        }
        // Forget deleted uids the watch no longer shows.
        if !deleted.is_empty() {
            let live: HashSet<String> = pods
                .state()
                .iter()
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            deleted.retain(|u| live.contains(u));
        }
    }
}

/// `addConditionAndDeletePod`: the pod's uid if this call deleted it (a pod
/// already gone is no error and no eviction).
async fn delete_pod(client: &kube::Client, key: &PodKey) -> anyhow::Result<Option<String>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
    let Some(pod) = api.get_opt(&key.name).await? else {
        return Ok(None);
    };
    let condition = json!({"status": {"conditions": [{
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint",
        "lastTransitionTime": util::now_rfc3339(),
    }]}});
    match api
        .patch_status(
            &key.name,
            &PatchParams::default(),
            &Patch::Strategic(condition),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
        r => {
            r?;
        }
    }
    match api.delete(&key.name, &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        r => {
            r?;
            Ok(pod.metadata.uid)
        }
    }
}
