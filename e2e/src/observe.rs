//! The one observer of Node and Pod versions both harnesses assert on: a
//! watch of every Node and one of every Pod as the admin sees them, each
//! version kept with its resourceVersion (etcd's revision, one counter for
//! the whole cluster, so a Node's and a Pod's versions order against each
//! other) and the moment it arrived.
//!
//! What is kept of each object is a [`Projection`]: the real-node suite
//! keeps whole objects (a handful of nodes), the scale harness a few
//! fields (1,000 nodes' versions would otherwise hold every Node and Pod
//! many times over).
//!
//! The watches run on a thread and runtime of their own, with a client of
//! their own: in a busy harness runtime (the scale simulator's 1,000
//! kubelets and agents) they would queue behind its tasks, and a figure read
//! from them would measure that backlog rather than the API server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

/// One version of an object as the watch delivered it.
#[derive(Debug, Clone)]
pub struct Seen<T> {
    /// When the watch delivered it.
    pub at: Instant,
    pub rv: u64,
    /// The version the object was deleted at.
    pub deleted: bool,
    pub obj: T,
}

/// What the observer keeps of an object: `None` keeps nothing of it.
pub trait Projection<K>: Sized {
    fn project(obj: &K) -> Option<Self>;
}

impl Projection<Node> for Node {
    fn project(obj: &Node) -> Option<Self> {
        Some(obj.clone())
    }
}

impl Projection<Pod> for Pod {
    fn project(obj: &Pod) -> Option<Self> {
        Some(obj.clone())
    }
}

/// Every version seen: Nodes by name, Pods by uid, each in order.
#[derive(Debug)]
pub struct Record<N, P> {
    pub nodes: HashMap<String, Vec<Seen<N>>>,
    pub pods: HashMap<String, Vec<Seen<P>>>,
}

impl<N, P> Default for Record<N, P> {
    fn default() -> Self {
        Record {
            nodes: HashMap::new(),
            pods: HashMap::new(),
        }
    }
}

impl<N, P> Record<N, P> {
    /// The last resourceVersion seen (an upper bound for "now").
    pub fn last_rv(&self) -> u64 {
        fn last<T>(m: &HashMap<String, Vec<Seen<T>>>) -> u64 {
            m.values()
                .filter_map(|v| v.last().map(|s| s.rv))
                .max()
                .unwrap_or(0)
        }
        last(&self.nodes).max(last(&self.pods))
    }
}

/// Appends a version unless a relist delivers one already kept.
fn keep<T>(versions: &mut Vec<Seen<T>>, seen: Seen<T>) {
    if versions
        .last()
        .is_none_or(|l| l.rv < seen.rv || (seen.deleted && !l.deleted))
    {
        versions.push(seen);
    }
}

/// What the pod watch selects (the scale harness: bound pods only).
#[derive(Debug, Clone, Default)]
pub struct Watches {
    pub pod_fields: Option<String>,
}

/// The observer's record, shared with its watches.
pub struct Observer<N, P> {
    record: Arc<Mutex<Record<N, P>>>,
}

impl<N, P> Clone for Observer<N, P> {
    fn clone(&self) -> Self {
        Observer {
            record: self.record.clone(),
        }
    }
}

impl<N, P> Observer<N, P>
where
    N: Projection<Node> + Send + 'static,
    P: Projection<Pod> + Send + 'static,
{
    /// Starts both watches with `admin`'s credentials; they run until the
    /// process ends.
    pub fn start(admin: kube::Config, watches: Watches) -> anyhow::Result<Self> {
        let record: Arc<Mutex<Record<N, P>>> = Arc::default();
        let r = record.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("observe".into())
            .spawn(move || {
                rt.block_on(async move {
                    match Client::try_from(admin) {
                        Ok(client) => watch(client, watches, r).await,
                        Err(e) => tracing::error!(error = %e, "observer client"),
                    }
                })
            })?;
        Ok(Observer { record })
    }
}

impl<N, P> Observer<N, P> {
    /// The record as it stands; hold it briefly, the watches wait on it.
    pub fn lock(&self) -> MutexGuard<'_, Record<N, P>> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn last_rv(&self) -> u64 {
        self.lock().last_rv()
    }
}

impl<N: Clone, P: Clone> Observer<N, P> {
    /// Every version of Node `name`, in order.
    pub fn node(&self, name: &str) -> Vec<Seen<N>> {
        self.lock().nodes.get(name).cloned().unwrap_or_default()
    }

    /// Every version of every Node, by resourceVersion.
    pub fn nodes(&self) -> Vec<Seen<N>> {
        let mut all: Vec<Seen<N>> = self.lock().nodes.values().flatten().cloned().collect();
        all.sort_by_key(|s| s.rv);
        all
    }

    /// Every version of every Pod, by resourceVersion.
    pub fn pods(&self) -> Vec<Seen<P>> {
        let mut all: Vec<Seen<P>> = self.lock().pods.values().flatten().cloned().collect();
        all.sort_by_key(|s| s.rv);
        all
    }
}

fn rv_of<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

async fn watch<N, P>(admin: Client, watches: Watches, record: Arc<Mutex<Record<N, P>>>)
where
    N: Projection<Node>,
    P: Projection<Pod>,
{
    let mut pods = watcher::Config::default();
    if let Some(fields) = &watches.pod_fields {
        pods = pods.fields(fields);
    }
    let nodes = follow(
        Api::<Node>::all(admin.clone()),
        watcher::Config::default(),
        &record,
        |r, name, _, seen| keep(r.nodes.entry(name).or_default(), seen),
    );
    let pods = follow(Api::<Pod>::all(admin), pods, &record, |r, _, uid, seen| {
        keep(r.pods.entry(uid).or_default(), seen)
    });
    futures::join!(nodes, pods);
}

/// Follows one watch, handing each kept version to `put` with the object's
/// name and uid.
async fn follow<K, T, N, P>(
    api: Api<K>,
    config: watcher::Config,
    record: &Mutex<Record<N, P>>,
    put: impl Fn(&mut Record<N, P>, String, String, Seen<T>),
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    T: Projection<K>,
{
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(ev) = stream.next().await {
        let (obj, deleted) = match ev {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
            Ok(watcher::Event::Delete(o)) => (o, true),
            _ => continue,
        };
        let Some(projected) = T::project(&obj) else {
            continue;
        };
        let seen = Seen {
            at: Instant::now(),
            rv: rv_of(&obj),
            deleted,
            obj: projected,
        };
        let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
        put(&mut r, obj.name_any(), obj.uid().unwrap_or_default(), seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(rv: u64, deleted: bool) -> Seen<()> {
        Seen {
            at: Instant::now(),
            rv,
            deleted,
            obj: (),
        }
    }

    #[test]
    fn a_relist_adds_no_version_twice_and_a_deletion_is_kept() {
        let mut v = Vec::new();
        keep(&mut v, seen(5, false));
        keep(&mut v, seen(7, false));
        // A relist delivers the latest version again.
        keep(&mut v, seen(7, false));
        keep(&mut v, seen(5, false));
        // A deletion is kept even at a resourceVersion already seen.
        keep(&mut v, seen(7, true));
        keep(&mut v, seen(7, true));
        let got: Vec<(u64, bool)> = v.iter().map(|s| (s.rv, s.deleted)).collect();
        assert_eq!(got, [(5, false), (7, false), (7, true)]);
    }

    #[test]
    fn the_last_resource_version_spans_nodes_and_pods() {
        let mut r: Record<(), ()> = Record::default();
        assert_eq!(r.last_rv(), 0);
        r.nodes.entry("a".into()).or_default().push(seen(4, false));
        r.pods.entry("u".into()).or_default().push(seen(9, false));
        r.nodes.entry("b".into()).or_default().push(seen(6, false));
        assert_eq!(r.last_rv(), 9);
    }
}
