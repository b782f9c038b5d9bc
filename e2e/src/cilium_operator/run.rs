//! The I/O loop: informer caches of Nodes and of Cilium pods, the node
//! queue, workers that decide from the caches and write.
//!
//! Upstream (`operator/watchers/node_taint.go`, `node.go`,
//! `node_taint_cell.go`): `nodesInit` / the node resource enqueue a Node's
//! name on every add and update; `ciliumPodsWatcher` watches the pods of
//! the Cilium namespace with the `cilium-pod-labels` selector and
//! `ciliumPodHandler` enqueues `spec.nodeName` on every add and update
//! (not on delete, not before the pod is bound). Workers start once both
//! caches synced (`WaitForCacheSync`); `TaintSyncWorkers` of them run
//! `checkTaintForNextNodeItem`: `checkAndMarkNode` on the *cached* node and
//! pods with a 10 s context, then `handleErr` — success or NotFound forgets
//! the key, any other error (a failed `test` is 422) re-adds it rate
//! limited. The cache may be stale when a worker reads it: that is kept —
//! the `test` of the cached taint list is what makes such a write fail
//! rather than clobber a newer list.
//!
//! Every write prints one line to stdout:
//! `WRITE <unix_ms> node=<name> action=<remove-taint|set-taint|set-condition> result=<ok|error: ...>`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinSet;

use super::config::OperatorConfig;
use super::decide::{self, Action, CiliumPod};
use super::queue::WorkQueue;

/// `checkTaintForNextNodeItem`'s context timeout.
const ITEM_TIMEOUT: Duration = Duration::from_secs(10);

/// How to run the controller.
#[derive(Debug, Clone)]
pub struct Options {
    pub config: OperatorConfig,
    /// Where the Cilium pods are (see [`OperatorConfig::resolve_pod_namespace`]).
    pub pod_namespace: String,
    /// The node queue's per-key backoff (upstream: 1 s doubling to 120 s).
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Print the `WRITE` lines to stdout.
    pub print: bool,
}

impl Options {
    pub fn new(config: OperatorConfig, pod_namespace: impl Into<String>) -> Self {
        Self {
            config,
            pod_namespace: pod_namespace.into(),
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(120),
            print: true,
        }
    }
}

/// One write and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    pub unix_ms: u128,
    pub node: String,
    pub action: Action,
    /// `None`: ok; `Some(message)`: the error.
    pub error: Option<String>,
}

impl WriteRecord {
    /// The `WRITE` line.
    pub fn line(&self) -> String {
        let result = match &self.error {
            None => "ok".to_string(),
            Some(e) => format!("error: {}", e.replace(['\n', '\r'], " ")),
        };
        format!(
            "WRITE {} node={} action={} result={result}",
            self.unix_ms,
            self.node,
            self.action.as_str()
        )
    }
}

/// Running totals of writes, by action and outcome.
#[derive(Debug, Default)]
pub struct Counters {
    remove_ok: AtomicU64,
    remove_err: AtomicU64,
    set_taint_ok: AtomicU64,
    set_taint_err: AtomicU64,
    condition_ok: AtomicU64,
    condition_err: AtomicU64,
    /// Keys re-added rate limited after a failure.
    retries: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub remove_ok: u64,
    pub remove_err: u64,
    pub set_taint_ok: u64,
    pub set_taint_err: u64,
    pub condition_ok: u64,
    pub condition_err: u64,
    pub retries: u64,
}

impl Counts {
    pub fn writes(&self) -> u64 {
        self.remove_ok
            + self.remove_err
            + self.set_taint_ok
            + self.set_taint_err
            + self.condition_ok
            + self.condition_err
    }
}

impl Counters {
    fn count(&self, action: Action, ok: bool) {
        let c = match (action, ok) {
            (Action::RemoveTaint, true) => &self.remove_ok,
            (Action::RemoveTaint, false) => &self.remove_err,
            (Action::SetTaint, true) => &self.set_taint_ok,
            (Action::SetTaint, false) => &self.set_taint_err,
            (Action::SetCondition, true) => &self.condition_ok,
            (Action::SetCondition, false) => &self.condition_err,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Counts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            remove_ok: g(&self.remove_ok),
            remove_err: g(&self.remove_err),
            set_taint_ok: g(&self.set_taint_ok),
            set_taint_err: g(&self.set_taint_err),
            condition_ok: g(&self.condition_ok),
            condition_err: g(&self.condition_err),
            retries: g(&self.retries),
        }
    }
}

struct Shared {
    opts: Options,
    api: Api<Node>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    queue: Arc<WorkQueue>,
    counters: Counters,
    log: Mutex<Vec<WriteRecord>>,
}

/// The running controller. Dropping it stops it.
pub struct Controller {
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// An error on one line: `<code> <reason>: <message>` for API errors.
fn short_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Runs one informer: every add or update enqueues the node `node_of`
/// names (upstream's AddFunc / UpdateFunc; neither informer has a
/// DeleteFunc).
fn informer<K: Send + 'static>(
    tasks: &mut JoinSet<()>,
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    queue: Arc<WorkQueue>,
    node_of: fn(&K) -> Option<&str>,
) {
    tasks.spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(e) = events.next().await {
            if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = e
                && let Some(node) = node_of(&o)
            {
                queue.add(node);
            }
        }
    });
}

impl Controller {
    /// Starts the informers and, once both synced, the workers. With the
    /// controller disabled (`registerNodeTaintSync`: neither
    /// remove-cilium-node-taints nor set-cilium-is-up-condition) it watches
    /// nothing and never writes.
    pub fn start(client: kube::Client, opts: Options) -> Self {
        let (nodes, node_writer) = reflector::store::<Node>();
        let (pods, pod_writer) = reflector::store::<Pod>();
        let shared = Arc::new(Shared {
            api: Api::all(client.clone()),
            queue: WorkQueue::new(opts.base_delay, opts.max_delay),
            nodes,
            pods,
            counters: Counters::default(),
            log: Mutex::default(),
            opts,
        });
        let mut tasks = JoinSet::new();
        if !shared.opts.config.controller_enabled() {
            return Self { shared, tasks };
        }

        let node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(node_writer);
        informer(&mut tasks, node_events, shared.queue.clone(), |n: &Node| {
            n.metadata.name.as_deref()
        });
        let pod_api = Api::<Pod>::namespaced(client, &shared.opts.pod_namespace);
        let pod_cfg = watcher::Config::default().labels(&shared.opts.config.pod_labels);
        let pod_events = watcher(pod_api, pod_cfg)
            .default_backoff()
            .reflect(pod_writer);
        // ciliumPodHandler: the pod's node, once it has one.
        informer(&mut tasks, pod_events, shared.queue.clone(), |p: &Pod| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .filter(|n| !n.is_empty())
        });

        let s = shared.clone();
        tasks.spawn(async move {
            // WaitForCacheSync of both before any worker runs.
            if s.nodes.wait_until_ready().await.is_err() || s.pods.wait_until_ready().await.is_err()
            {
                return;
            }
            let mut workers = JoinSet::new();
            for _ in 0..s.opts.config.workers {
                let s = s.clone();
                workers.spawn(async move { while s.process_next().await {} });
            }
            while workers.join_next().await.is_some() {}
        });
        Self { shared, tasks }
    }

    /// Running totals.
    pub fn counts(&self) -> Counts {
        self.shared.counters.snapshot()
    }

    /// Every write so far, in order.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the workers and the watches.
    pub async fn stop(mut self) {
        self.shared.queue.shut_down();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.shared.queue.shut_down();
        self.tasks.abort_all();
    }
}

/// Why one item failed.
enum ItemError {
    /// The node is gone (from the cache, or the server said 404): forget it.
    NotFound,
    Other,
}

impl Shared {
    /// `checkTaintForNextNodeItem` + `handleErr`.
    async fn process_next(self: &Arc<Self>) -> bool {
        let Some(key) = self.queue.get().await else {
            return false;
        };
        let res = tokio::time::timeout(ITEM_TIMEOUT, self.check_and_mark_node(&key))
            .await
            .unwrap_or(Err(ItemError::Other));
        match res {
            Ok(()) | Err(ItemError::NotFound) => self.queue.forget(&key),
            Err(ItemError::Other) => {
                self.counters.retries.fetch_add(1, Ordering::Relaxed);
                self.queue.add_rate_limited(&key);
            }
        }
        self.queue.done(&key);
        true
    }

    /// The cached node (`nodeGetter.GetK8sSlimNode`).
    fn cached_node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The cached Cilium pods of a node (the hostname index).
    fn cached_pods(&self, node: &str) -> Vec<CiliumPod> {
        self.pods
            .state()
            .iter()
            .filter_map(|p| CiliumPod::from_cached(p))
            .filter(|(n, _)| n == node)
            .map(|(_, p)| p)
            .collect()
    }

    /// `checkAndMarkNode` → `markNode`: each step re-reads the cached node,
    /// as each upstream write function does; the first failure ends it.
    async fn check_and_mark_node(&self, name: &str) -> Result<(), ItemError> {
        let cfg = &self.opts.config;
        let node = self.cached_node(name).ok_or(ItemError::NotFound)?;
        let steps = decide::check_and_mark_node(&node, &self.cached_pods(name), cfg);
        for action in steps {
            let node = self.cached_node(name).ok_or(ItemError::NotFound)?;
            let Some(w) = decide::write_for(action, &node, cfg, &now()) else {
                continue;
            };
            self.send(name, w).await?;
        }
        Ok(())
    }

    async fn send(&self, name: &str, w: decide::Write) -> Result<(), ItemError> {
        let pp = PatchParams::default();
        let res = if w.is_status() {
            self.api
                .patch_status(name, &pp, &Patch::Strategic(&w.patch))
                .await
                .map(drop)
        } else {
            match serde_json::from_value::<json_patch::Patch>(w.patch.clone()) {
                Ok(p) => self
                    .api
                    .patch(name, &pp, &Patch::Json::<()>(p))
                    .await
                    .map(drop),
                Err(e) => Err(kube::Error::SerdeError(e)),
            }
        };
        let not_found = matches!(&res, Err(kube::Error::Api(s)) if s.code == 404);
        let rec = WriteRecord {
            unix_ms: unix_ms(),
            node: name.to_string(),
            action: w.action,
            error: res.as_ref().err().map(short_error),
        };
        self.counters.count(w.action, rec.error.is_none());
        if self.opts.print {
            println!("{}", rec.line());
        }
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(rec);
        match res {
            Ok(()) => Ok(()),
            Err(_) if not_found => Err(ItemError::NotFound),
            Err(_) => Err(ItemError::Other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_line_format() {
        let mut r = WriteRecord {
            unix_ms: 1_700_000_000_123,
            node: "n1".into(),
            action: Action::RemoveTaint,
            error: None,
        };
        assert_eq!(
            r.line(),
            "WRITE 1700000000123 node=n1 action=remove-taint result=ok"
        );
        r.action = Action::SetCondition;
        r.error = Some("422 Invalid:\ntest failed".into());
        assert_eq!(
            r.line(),
            "WRITE 1700000000123 node=n1 action=set-condition result=error: 422 Invalid: test failed"
        );
    }
}
