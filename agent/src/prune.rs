//! Stale-node pruning: the live set of Nodes (from the roster or a Node
//! watch), the diff against the snapshot read at start, and the coalesced
//! snapshot writer.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use nodegate_roster::shard;
pub use nodegate_roster::view::NodeEvents;
use nodegate_roster::view::{Membership, RosterView};
use tokio::sync::{mpsc, watch};

use crate::handler::DeleteSource;
use crate::metrics::Metrics;
use crate::record::{NodeRecord, SlimNode};
use crate::snapshot;

/// Nodes of `snapshot` that are not live now, compared by name AND uid: a
/// node re-created under the same name is a different node, so the old one
/// counts as deleted. The own node is never reported.
pub fn diff(
    snapshot: Vec<NodeRecord>,
    live: &HashMap<String, NodeRecord>,
    own: &str,
) -> Vec<NodeRecord> {
    snapshot
        .into_iter()
        .filter(|n| n.name != own)
        .filter(|n| live.get(&n.name).map(|l| l.uid.as_str()) != Some(n.uid.as_str()))
        .collect()
}

/// The watch-driven state, free of I/O so it can be tested event by event.
#[derive(Debug)]
pub struct Pruner {
    own: String,
    live: HashMap<String, NodeRecord>,
    /// Snapshot read at start; consumed by the first complete list.
    snapshot: Option<Vec<NodeRecord>>,
    /// Deleted nodes whose handlers have not finished, by uid. They stay in
    /// the snapshot so a crash before the handler ran is retried at restart.
    unhandled: HashMap<String, NodeRecord>,
    initialized: bool,
    dirty: bool,
}

pub type Deletion = (NodeRecord, DeleteSource);

impl Pruner {
    pub fn new(own: impl Into<String>, snapshot: Vec<NodeRecord>) -> Self {
        Self {
            own: own.into(),
            live: HashMap::new(),
            snapshot: Some(snapshot),
            unhandled: HashMap::new(),
            initialized: false,
            dirty: false,
        }
    }

    /// True once the first full list is in: the live set is complete and the
    /// snapshot may be written.
    pub fn is_initialized(&self) -> bool {
        self.initialized
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The live set (own node excluded).
    pub fn live(&self) -> impl Iterator<Item = &NodeRecord> {
        self.live.values()
    }

    /// What the snapshot holds: live nodes and deletions not yet handled.
    pub fn records(&self) -> impl Iterator<Item = &NodeRecord> {
        self.live.values().chain(self.unhandled.values())
    }

    /// Deletions dispatched but not yet reported done.
    pub fn unhandled(&self) -> usize {
        self.unhandled.len()
    }

    /// The handlers are done with the node of this uid (successfully or
    /// not: failures are counted, never retried forever).
    pub fn handled(&mut self, uid: &str) {
        if self.unhandled.remove(uid).is_some() {
            self.dirty = true;
        }
    }

    /// Applies one membership change and returns the deletions it implies;
    /// they count as unhandled until [`Pruner::handled`].
    pub fn apply(&mut self, change: Membership) -> Vec<Deletion> {
        let deletions = self.apply_inner(change);
        for (r, _) in &deletions {
            self.unhandled.insert(r.uid.clone(), r.clone());
            self.dirty = true;
        }
        deletions
    }

    /// Returns and clears "changed since the last snapshot write".
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty) && self.initialized
    }

    fn apply_inner(&mut self, change: Membership) -> Vec<Deletion> {
        match change {
            Membership::Reset(mut listed) => {
                listed.remove(&self.own);
                let deletions = match self.snapshot.take() {
                    // First complete view: whatever the snapshot has that is gone now.
                    Some(snap) => diff(snap, &listed, &self.own)
                        .into_iter()
                        .map(|r| (r, DeleteSource::Snapshot))
                        .collect(),
                    // Complete again after a gap: deletions missed meanwhile.
                    None => {
                        let old: Vec<NodeRecord> = self.live.drain().map(|(_, r)| r).collect();
                        diff(old, &listed, &self.own)
                            .into_iter()
                            .map(|r| (r, DeleteSource::Watch))
                            .collect()
                    }
                };
                self.live = listed;
                self.initialized = true;
                self.dirty = true;
                deletions
            }
            // Before the first complete view only a Reset counts: a change
            // seen then is part of the view the Reset will carry.
            _ if !self.initialized => Vec::new(),
            Membership::Upsert(r) => {
                if r.name == self.own || self.live.get(&r.name) == Some(&r) {
                    // Heartbeats and taint changes do not touch the record:
                    // no snapshot write for them.
                    return Vec::new();
                }
                self.dirty = true;
                match self.live.insert(r.name.clone(), r) {
                    // Same name, new uid: the old node was deleted meanwhile.
                    Some(old) if Some(&old.uid) != self.live.get(&old.name).map(|n| &n.uid) => {
                        vec![(old, DeleteSource::Watch)]
                    }
                    _ => Vec::new(),
                }
            }
            Membership::Remove(r) => {
                if r.name == self.own {
                    return Vec::new();
                }
                match self.live.get(&r.name) {
                    Some(stored) if stored.uid == r.uid => {
                        self.dirty = true;
                        // The stored record is the full one to hand on.
                        let stored = self.live.remove(&r.name).unwrap_or(r);
                        vec![(stored, DeleteSource::Watch)]
                    }
                    // A delete of an older incarnation already replaced.
                    Some(_) => Vec::new(),
                    None => vec![(r, DeleteSource::Watch)],
                }
            }
        }
    }
}

/// Everything the prune loop needs besides the API.
pub struct PruneContext {
    pub state_dir: PathBuf,
    pub snapshot_interval: Duration,
    pub metrics: Metrics,
    /// Set after the first full list (`/readyz`).
    pub listed: Arc<AtomicBool>,
    pub deletions: mpsc::UnboundedSender<Deletion>,
}

/// Where the pruner learns which nodes exist.
pub enum Source {
    /// A watch on every Node: simple, but every status write of every node
    /// reaches every agent. For small clusters.
    Nodes(Api<SlimNode>),
    /// The roster's shard ConfigMaps: a change only when a node joins,
    /// leaves or changes its addresses, CIDRs or providerID.
    Roster { api: Api<ConfigMap>, name: String },
}

/// A membership stream and what it reports along the way.
type Changes = futures::stream::BoxStream<'static, Result<Vec<Membership>, watcher::Error>>;

impl Source {
    fn changes(self, metrics: Metrics) -> Changes {
        match self {
            Source::Nodes(api) => {
                let mut adapter = NodeEvents::default();
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .map(move |ev| ev.map(|ev| adapter.apply(ev).into_iter().collect()))
                    .boxed()
            }
            Source::Roster { api, name } => {
                let selector = shard::selector(&name);
                let mut view = RosterView::new(name);
                watcher(api, watcher::Config::default().labels(&selector))
                    .default_backoff()
                    .map(move |ev| {
                        ev.map(|ev| {
                            let step = view.apply(ev);
                            for (name, e) in &step.rejected {
                                metrics.roster_rejected.inc();
                                tracing::warn!(shard = %name, error = %e, "roster shard rejected: pruning paused until it is valid again");
                            }
                            metrics.roster_shards.set(view.shards() as i64);
                            let complete = view.is_complete();
                            if metrics.roster_complete.set(i64::from(complete)) != i64::from(complete) {
                                tracing::info!(complete, shards = view.shards(), "roster completeness changed");
                            }
                            step.changes
                        })
                    })
                    .boxed()
            }
        }
    }
}

/// Follows `source` until `shutdown` flips, writing the snapshot at most
/// once per interval while dirty, and once more at the end. `handled`
/// carries the uids of deletions the handlers are done with.
pub async fn run(
    source: Source,
    mut pruner: Pruner,
    ctx: PruneContext,
    mut handled: mpsc::UnboundedReceiver<String>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut stream = source.changes(ctx.metrics.clone());
    let mut tick = tokio::time::interval(ctx.snapshot_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(changes)) => {
                    for change in changes {
                        for d in pruner.apply(change) {
                            let _ = ctx.deletions.send(d);
                        }
                    }
                    ctx.metrics.nodes_known.set(pruner.len() as i64);
                    if pruner.is_initialized() && !ctx.listed.swap(true, Ordering::SeqCst) {
                        tracing::info!(nodes = pruner.len(), "first complete view of the nodes");
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "watch failed, retrying"),
                None => break,
            },
            Some(uid) = handled.recv() => pruner.handled(&uid),
            _ = tick.tick() => {
                if pruner.take_dirty() {
                    write_snapshot(&pruner, &ctx).await;
                }
            }
            _ = crate::stopped(&mut shutdown) => break,
        }
    }
    if pruner.is_initialized() {
        write_snapshot(&pruner, &ctx).await;
    }
}

/// Encodes and writes the live set; failures are logged and counted (the
/// next tick retries, as the state stays in memory).
pub async fn write_snapshot(pruner: &Pruner, ctx: &PruneContext) {
    let start = Instant::now();
    let bytes = match snapshot::encode(pruner.records()) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode snapshot");
            return;
        }
    };
    let len = bytes.len();
    let dir = ctx.state_dir.clone();
    let res = tokio::task::spawn_blocking(move || snapshot::write_atomic(&dir, &bytes)).await;
    match res {
        Ok(Ok(())) => {
            ctx.metrics
                .snapshot_write_seconds
                .observe(start.elapsed().as_secs_f64());
            ctx.metrics
                .snapshot_nodes
                .set((pruner.len() + pruner.unhandled()) as i64);
            ctx.metrics.snapshot_bytes.set(len as i64);
            tracing::debug!(
                nodes = pruner.len(),
                unhandled = pruner.unhandled(),
                bytes = len,
                "snapshot written"
            );
        }
        Ok(Err(e)) => {
            ctx.metrics.snapshot_write_failures.inc();
            tracing::error!(error = %e, dir = %ctx.state_dir.display(), "cannot write snapshot");
        }
        Err(e) => {
            ctx.metrics.snapshot_write_failures.inc();
            tracing::error!(error = %e, "snapshot writer task failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(name: &str, uid: &str) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            uid: uid.into(),
            addresses: vec![],
            pod_cidrs: vec![format!("10.0.{}.0/24", name.len())],
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        }
    }

    fn node(name: &str, uid: &str) -> SlimNode {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": uid},
            "spec": {"podCIDR": format!("10.0.{}.0/24", name.len())}}))
        .unwrap()
    }

    fn names(d: &[Deletion]) -> Vec<(&str, &str, DeleteSource)> {
        let mut v: Vec<_> = d
            .iter()
            .map(|(r, s)| (r.name.as_str(), r.uid.as_str(), *s))
            .collect();
        v.sort();
        v
    }

    fn live(nodes: &[(&str, &str)]) -> HashMap<String, NodeRecord> {
        nodes
            .iter()
            .map(|(n, u)| (n.to_string(), rec(n, u)))
            .collect()
    }

    /// A pruner fed Node watch events through [`NodeEvents`].
    struct Fed {
        p: Pruner,
        n: NodeEvents,
    }

    impl Fed {
        fn new(own: &str, snap: Vec<NodeRecord>) -> Self {
            Fed {
                p: Pruner::new(own, snap),
                n: NodeEvents::default(),
            }
        }

        fn apply(&mut self, ev: watcher::Event<SlimNode>) -> Vec<Deletion> {
            match self.n.apply(ev) {
                Some(m) => self.p.apply(m),
                None => Vec::new(),
            }
        }
    }

    impl std::ops::Deref for Fed {
        type Target = Pruner;
        fn deref(&self) -> &Pruner {
            &self.p
        }
    }

    impl std::ops::DerefMut for Fed {
        fn deref_mut(&mut self) -> &mut Pruner {
            &mut self.p
        }
    }

    #[test]
    fn diff_by_name_and_uid_excluding_own() {
        let snap = vec![
            rec("gone", "1"),
            rec("same", "2"),
            rec("recreated", "3"),
            rec("me", "4"),
        ];
        let now = live(&[("same", "2"), ("recreated", "33"), ("new", "5")]);
        let d = diff(snap, &now, "me");
        let got: Vec<_> = d
            .iter()
            .map(|r| (r.name.as_str(), r.uid.as_str()))
            .collect();
        assert_eq!(got, vec![("gone", "1"), ("recreated", "3")]);
        // The full stored record is what handlers get.
        assert_eq!(d[0], rec("gone", "1"));
    }

    #[test]
    fn first_list_synthesizes_deletions_and_never_resurrects() {
        let snap = vec![rec("a", "1"), rec("b", "2"), rec("c", "3"), rec("me", "0")];
        let mut p = Fed::new("me", snap);
        assert!(p.apply(watcher::Event::Init).is_empty());
        for (n, u) in [("a", "1"), ("c", "33"), ("d", "4"), ("me", "0")] {
            assert!(p.apply(watcher::Event::InitApply(node(n, u))).is_empty());
        }
        assert!(!p.is_initialized());
        assert!(
            !p.take_dirty(),
            "nothing written before the first full list"
        );
        let d = p.apply(watcher::Event::InitDone);
        assert_eq!(
            names(&d),
            vec![
                ("b", "2", DeleteSource::Snapshot),
                ("c", "3", DeleteSource::Snapshot)
            ]
        );
        let mut live: Vec<_> = p.live().map(|r| (r.name.clone(), r.uid.clone())).collect();
        live.sort();
        let want: Vec<(String, String)> = [("a", "1"), ("c", "33"), ("d", "4")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(
            live, want,
            "own node not stored, deleted ones not resurrected"
        );
        assert!(p.take_dirty());
        assert!(!p.take_dirty());
    }

    #[test]
    fn deletions_stay_in_the_snapshot_until_handled() {
        let mut p = Fed::new("me", vec![rec("a", "1"), rec("b", "2")]);
        p.apply(watcher::Event::Init);
        p.apply(watcher::Event::InitApply(node("a", "1")));
        let d = p.apply(watcher::Event::InitDone);
        assert_eq!(names(&d), vec![("b", "2", DeleteSource::Snapshot)]);
        let d = p.apply(watcher::Event::Delete(node("a", "1")));
        assert_eq!(names(&d), vec![("a", "1", DeleteSource::Watch)]);
        assert!(p.is_empty());
        let mut held: Vec<_> = p.records().map(|r| r.name.as_str()).collect();
        held.sort_unstable();
        assert_eq!(held, vec!["a", "b"], "a crash now retries both at restart");
        assert!(p.take_dirty());
        p.handled("2");
        assert!(p.take_dirty(), "handled deletions rewrite the snapshot");
        p.handled("1");
        assert_eq!(p.records().count(), 0);
        assert!(p.take_dirty());
        p.handled("1");
        assert!(!p.take_dirty(), "unknown uid changes nothing");
    }

    #[test]
    fn watch_deletions_and_relist_gaps() {
        let mut p = Fed::new("me", vec![]);
        p.apply(watcher::Event::Init);
        p.apply(watcher::Event::InitApply(node("a", "1")));
        p.apply(watcher::Event::InitApply(node("b", "2")));
        assert!(p.apply(watcher::Event::InitDone).is_empty(), "first start");
        // Delete: the stored record goes to the handlers.
        let d = p.apply(watcher::Event::Delete(node("a", "1")));
        assert_eq!(names(&d), vec![("a", "1", DeleteSource::Watch)]);
        assert_eq!(d[0].0, rec("a", "1"));
        // Re-created under the same name without a DELETED seen.
        let d = p.apply(watcher::Event::Apply(node("b", "22")));
        assert_eq!(names(&d), vec![("b", "2", DeleteSource::Watch)]);
        // A late delete of the old incarnation does not remove the new one.
        assert!(p.apply(watcher::Event::Delete(node("b", "2"))).is_empty());
        assert_eq!(p.len(), 1);
        // An update that leaves the record as it was writes nothing.
        p.take_dirty();
        assert!(p.apply(watcher::Event::Apply(node("b", "22"))).is_empty());
        assert!(!p.take_dirty(), "unchanged record: no snapshot write");
        // Own node events are ignored.
        assert!(p.apply(watcher::Event::Apply(node("me", "0"))).is_empty());
        assert!(p.apply(watcher::Event::Delete(node("me", "0"))).is_empty());
        // A relist that misses "b" reports it as a watch deletion.
        p.apply(watcher::Event::Apply(node("c", "3")));
        p.apply(watcher::Event::Init);
        p.apply(watcher::Event::InitApply(node("c", "3")));
        let d = p.apply(watcher::Event::InitDone);
        assert_eq!(names(&d), vec![("b", "22", DeleteSource::Watch)]);
        assert_eq!(p.len(), 1);
    }
}
