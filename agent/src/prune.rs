//! Stale-node pruning as a state machine: membership changes (from the
//! roster or a Node watch), confirmation answers, handler completions and
//! snapshot ticks in; the GETs, handler dispatches, snapshot writes and
//! counts they lead to out. No I/O: the caller passes the time and runs the
//! actions (`prune_loop`).
//!
//! Two parts: [`Pruner`] keeps the live set and diffs it against the
//! snapshot read at start; [`crate::confirm`] has the API server confirm
//! every deletion before a handler runs. [`State`] joins them.

use std::collections::HashMap;
use std::time::Instant;

use nodegate_roster::view::Membership;
pub use nodegate_roster::view::NodeEvents;

use crate::confirm::{Confirmer, Lookup, Outcome};
use crate::deletion::DeleteSource;
pub use crate::deletion::Deletion;
use crate::record::NodeRecord;

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

    /// The nodes a change is measured against: the live set, or before the
    /// first complete view the snapshot it will be compared with.
    pub fn known(&self) -> usize {
        match &self.snapshot {
            Some(s) if !self.initialized => s.len(),
            _ => self.live.len(),
        }
    }

    /// Deletions the API server refused (it still has those nodes with
    /// those uids): they are live after all. A record of a newer incarnation
    /// already live is kept.
    pub fn restore(&mut self, records: Vec<NodeRecord>) {
        for r in records {
            self.unhandled.remove(&r.uid);
            if r.name != self.own {
                self.live.entry(r.name.clone()).or_insert(r);
            }
            self.dirty = true;
        }
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

/// What happened.
#[derive(Debug, Clone)]
pub enum Event {
    /// One event of the node source, as its membership changes: one batch
    /// (a shard rewrite that drops many nodes is a mass deletion).
    Changed(Vec<Membership>),
    /// The time [`State::next_due`] named has come.
    Due,
    /// The API server's answer to [`Action::Lookup`] of the node with `uid`.
    Looked { uid: String, result: Lookup },
    /// The handlers are done with the node of this uid.
    Handled(String),
    /// The snapshot interval elapsed.
    Tick,
    /// Stopping: the last snapshot.
    Stop,
}

/// What to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// GET the node by the record's name (one at a time); answer with
    /// [`Event::Looked`] for the record's uid.
    Lookup(NodeRecord),
    /// Run the handlers on a confirmed deletion; answer with
    /// [`Event::Handled`] when they are done.
    Dispatch(Deletion),
    /// Write [`State::records`] as the snapshot.
    WriteSnapshot,
    /// The first complete view of the nodes is in (the agent is ready).
    Listed,
    /// A mass deletion was held.
    CountHold,
    /// One confirmation answered: `gone`, `live` or `error`.
    CountConfirmation(&'static str),
    /// Deletions refused: the API server still has those nodes.
    CountRefused(u64),
}

/// The pruning's memory between events.
#[derive(Debug)]
pub struct State {
    nodes: Pruner,
    confirmer: Confirmer,
    listed: bool,
}

impl State {
    pub fn new(nodes: Pruner, confirmer: Confirmer) -> Self {
        Self {
            nodes,
            confirmer,
            listed: false,
        }
    }

    /// Feeds one event at `now`; returns what to do.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Changed(changes) => {
                let known = self.nodes.known();
                let deletions: Vec<Deletion> = changes
                    .into_iter()
                    .flat_map(|c| self.nodes.apply(c))
                    .collect();
                self.confirmer.set_known(self.nodes.len().max(known));
                let n = deletions.len();
                if self.confirmer.submit(deletions, known, now) {
                    out.push(Action::CountHold);
                    tracing::warn!(
                        deletions = n,
                        known,
                        "mass deletion held: confirming one node at a time with the API server; the first node it still has refuses the rest"
                    );
                }
                if self.nodes.is_initialized() && !self.listed {
                    self.listed = true;
                    out.push(Action::Listed);
                    tracing::info!(nodes = self.nodes.len(), "first complete view of the nodes");
                }
            }
            Event::Due => out.extend(self.confirmer.start(now).map(Action::Lookup)),
            Event::Looked { uid, result } => self.conclude(&uid, result, now, &mut out),
            Event::Handled(uid) => self.nodes.handled(&uid),
            Event::Tick => {
                if self.nodes.take_dirty() {
                    out.push(Action::WriteSnapshot);
                }
            }
            // Unconfirmed deletions stay in the snapshot: confirmed after a restart.
            Event::Stop => {
                if self.nodes.is_initialized() {
                    out.push(Action::WriteSnapshot);
                }
            }
        }
        out
    }

    /// Acts on a confirmation's answer.
    fn conclude(&mut self, uid: &str, result: Lookup, now: Instant, out: &mut Vec<Action>) {
        out.push(Action::CountConfirmation(match &result {
            Lookup::Missing => "gone",
            Lookup::Uid(u) if u == uid => "live",
            Lookup::Uid(u) if !u.is_empty() => "gone",
            Lookup::Uid(_) | Lookup::Failed(_) => "error",
        }));
        match self.confirmer.finish(uid, result.clone(), now) {
            Outcome::Gone(d) => out.push(Action::Dispatch(d)),
            Outcome::Live(records) => {
                out.push(Action::CountRefused(records.len() as u64));
                let names: Vec<&str> = records.iter().take(5).map(|r| r.name.as_str()).collect();
                tracing::error!(refused = records.len(), first = ?names, "the node source reported live nodes deleted (the API server still has them with those uids): no handler runs; a forged roster shard?");
                self.nodes.restore(records);
            }
            Outcome::Retry => {
                if let Lookup::Failed(e) = &result {
                    tracing::warn!(%uid, error = %e, "cannot confirm a deletion with the API server; retrying later");
                }
            }
            Outcome::Unknown => {}
        }
    }

    /// When to send [`Event::Due`] next; `None`: no confirmation to start.
    pub fn next_due(&self) -> Option<Instant> {
        self.confirmer.next_due()
    }

    /// What the snapshot holds: live nodes and deletions not yet handled.
    pub fn records(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.records()
    }

    /// Live nodes (own node excluded).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Deletions dispatched but not yet reported done.
    pub fn unhandled(&self) -> usize {
        self.nodes.unhandled()
    }

    /// Deletions waiting for a confirmation.
    pub fn pending(&self) -> usize {
        self.confirmer.pending()
    }

    /// Of those, the ones in held mass deletions.
    pub fn held(&self) -> usize {
        self.confirmer.held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confirm::ConfirmConfig;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;
    use nodegate_roster::shard;
    use nodegate_roster::view::RosterView;
    use nodegate_shared::NodeResource;
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

    fn node(name: &str, uid: &str) -> NodeResource {
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

        fn apply(&mut self, ev: watcher::Event<NodeResource>) -> Vec<Deletion> {
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

    /// Runs every pending confirmation against an API server holding `api`
    /// (name → uid); returns the deletions that reach the handlers.
    fn settle(
        c: &mut Confirmer,
        p: &mut Pruner,
        api: &HashMap<String, String>,
        gets: &mut usize,
    ) -> Vec<Deletion> {
        let mut out = Vec::new();
        while let Some(at) = c.next_due() {
            let r = c.start(at).unwrap();
            *gets += 1;
            let answer = match api.get(&r.name) {
                Some(u) => Lookup::Uid(u.clone()),
                None => Lookup::Missing,
            };
            match c.finish(&r.uid, answer, at) {
                Outcome::Gone(d) => {
                    p.handled(&d.0.uid);
                    out.push(d);
                }
                Outcome::Live(rs) => p.restore(rs),
                Outcome::Retry | Outcome::Unknown => {}
            }
        }
        out
    }

    /// The roster poisoning attack end to end through the pure layers
    /// (shard ConfigMaps → view → pruner → confirmation): a forged epoch is
    /// rejected, a plausible forged empty roster is held and refused after
    /// one GET, and a later real deletion is pruned exactly once.
    #[test]
    fn a_forged_roster_runs_no_handler_and_a_later_deletion_runs_once() {
        use nodegate_roster::shard::{config_map, encode, shard_of, unix_now};
        const R: &str = shard::DEFAULT_NAME;
        let now = unix_now();
        let mut api: HashMap<String, String> = (0..10)
            .map(|i| (format!("n{i}"), format!("uid-{i}")))
            .collect();
        let shard_cm = |api: &HashMap<String, String>, i: u32| {
            let recs: Vec<NodeRecord> = api
                .iter()
                .filter(|(n, _)| shard_of(n, 2) == i)
                .map(|(n, u)| rec(n, u))
                .collect();
            config_map("nodegate", R, i, encode(now - 100, i, 2, &recs))
        };
        let mut view = RosterView::new(R);
        let mut p = Pruner::new("me", vec![]);
        let cfg = ConfirmConfig {
            qps: 200.0,
            hold_count: 50,
            hold_share: 0.2,
        };
        let t0 = Instant::now();
        let mut c = Confirmer::new(cfg, 42, t0);
        let mut gets = 0;
        let mut handled: Vec<Deletion> = Vec::new();
        let feed = |view: &mut RosterView,
                    p: &mut Pruner,
                    c: &mut Confirmer,
                    ev: watcher::Event<ConfigMap>,
                    api: &HashMap<String, String>,
                    gets: &mut usize|
         -> (bool, Vec<Deletion>) {
            let known = p.known();
            let dels: Vec<Deletion> = view
                .apply(ev)
                .changes
                .into_iter()
                .flat_map(|m| p.apply(m))
                .collect();
            c.set_known(p.len().max(known));
            let held = c.submit(dels, known, t0);
            (held, settle(c, p, api, gets))
        };
        view.apply(watcher::Event::Init);
        for i in 0..2 {
            view.apply(watcher::Event::InitApply(shard_cm(&api, i)));
        }
        let (_, d) = feed(
            &mut view,
            &mut p,
            &mut c,
            watcher::Event::InitDone,
            &api,
            &mut gets,
        );
        assert!(d.is_empty() && p.len() == 10);

        // The forged shard, as a namespace editor or the roster's token writes it.
        let forged = |epoch: u64| {
            config_map(
                "nodegate",
                R,
                0,
                format!(r#"{{"version":1,"epoch":{epoch},"shard":0,"shards":1,"nodes":[]}}"#),
            )
        };
        let (held, d) = feed(
            &mut view,
            &mut p,
            &mut c,
            watcher::Event::Apply(forged(u64::MAX)),
            &api,
            &mut gets,
        );
        assert!(!held && d.is_empty() && gets == 0, "rejected outright");
        // An epoch a publisher could have written: a complete, empty roster.
        let (held, d) = feed(
            &mut view,
            &mut p,
            &mut c,
            watcher::Event::Apply(forged(now + 60)),
            &api,
            &mut gets,
        );
        assert!(held, "every node at once is a mass deletion");
        assert!(d.is_empty(), "no handler for a live node: {d:?}");
        assert_eq!(gets, 1, "one GET refuted the whole batch");
        assert_eq!(p.len(), 10, "refused deletions are live again");
        assert_eq!(p.records().count(), 10);

        // The publisher rewrites the shard: nothing deleted.
        let (_, d) = feed(
            &mut view,
            &mut p,
            &mut c,
            watcher::Event::Apply(shard_cm(&api, 0)),
            &api,
            &mut gets,
        );
        assert!(d.is_empty());
        // A real deletion later: confirmed (404) and handled exactly once.
        api.remove("n3");
        let (held, d) = feed(
            &mut view,
            &mut p,
            &mut c,
            watcher::Event::Apply(shard_cm(&api, shard_of("n3", 2))),
            &api,
            &mut gets,
        );
        handled.extend(d);
        assert!(!held);
        assert_eq!(names(&handled), vec![("n3", "uid-3", DeleteSource::Watch)]);
        assert_eq!(gets, 2);
        assert_eq!(p.records().count(), 9, "handled: out of the snapshot");
    }

    /// An agent restarting while the roster is forged empty: its snapshot
    /// against the empty view is a mass deletion, held and refused; the
    /// snapshot's nodes stay. When the roster is right again, only the node
    /// really deleted meanwhile is handled, once, from the snapshot.
    #[test]
    fn a_restart_into_a_forged_roster_keeps_the_snapshot() {
        let snap: Vec<NodeRecord> = (0..10)
            .map(|i| rec(&format!("n{i}"), &i.to_string()))
            .collect();
        let mut api: HashMap<String, String> = snap
            .iter()
            .map(|r| (r.name.clone(), r.uid.clone()))
            .collect();
        api.remove("n7");
        let cfg = ConfirmConfig {
            qps: 200.0,
            hold_count: 50,
            hold_share: 0.2,
        };
        let t0 = Instant::now();
        let mut c = Confirmer::new(cfg, 1, t0);
        let mut p = Pruner::new("me", snap);
        let mut gets = 0;
        // Forged: complete and empty.
        let known = p.known();
        assert_eq!(known, 10);
        let d = p.apply(Membership::Reset(HashMap::new()));
        assert_eq!(d.len(), 10);
        assert!(c.submit(d, known, t0), "held");
        let handled = settle(&mut c, &mut p, &api, &mut gets);
        // The batch is refused at the first live node (n7, truly gone, may
        // come first in the random order and is then handled).
        assert!(handled.iter().all(|(r, _)| r.name == "n7"), "{handled:?}");
        assert!(gets <= 2, "{gets}");
        // The publisher's roster: the live nodes.
        let listed: HashMap<String, NodeRecord> =
            api.iter().map(|(n, u)| (n.clone(), rec(n, u))).collect();
        let known = p.known();
        let d = p.apply(Membership::Reset(listed));
        let held = c.submit(d, known, t0);
        let mut all = handled;
        all.extend(settle(&mut c, &mut p, &api, &mut gets));
        assert!(!held);
        let got: Vec<(&str, &str)> = all
            .iter()
            .map(|(r, _)| (r.name.as_str(), r.uid.as_str()))
            .collect();
        assert_eq!(got, vec![("n7", "7")], "exactly once");
        assert_eq!(p.records().count(), 9);
    }

    const CFG: ConfirmConfig = ConfirmConfig {
        qps: 200.0,
        hold_count: 50,
        hold_share: 0.2,
    };

    /// An action as a short word, so a table reads like the story it tells.
    fn brief(a: &Action) -> String {
        match a {
            Action::Lookup(r) => format!("get:{}", r.name),
            Action::Dispatch((r, s)) => format!("dispatch:{}/{s}", r.name),
            Action::WriteSnapshot => "write".into(),
            Action::Listed => "listed".into(),
            Action::CountHold => "hold".into(),
            Action::CountConfirmation(l) => format!("confirm:{l}"),
            Action::CountRefused(n) => format!("refused:{n}"),
        }
    }

    fn reset(nodes: &[(&str, &str)]) -> Event {
        Event::Changed(vec![Membership::Reset(live(nodes))])
    }

    fn looked(uid: &str, result: Lookup) -> Event {
        Event::Looked {
            uid: uid.into(),
            result,
        }
    }

    /// Runs `steps` (event, the actions it must give) through a fresh state
    /// with `snapshot`; [`Event::Due`] comes at the time the state named.
    fn run(name: &str, snapshot: Vec<NodeRecord>, steps: Vec<(Event, &[&str])>) {
        let t0 = Instant::now();
        let mut s = State::new(Pruner::new("me", snapshot), Confirmer::new(CFG, 7, t0));
        let mut now = t0;
        for (i, (event, want)) in steps.into_iter().enumerate() {
            if matches!(event, Event::Due) {
                now = s.next_due().unwrap_or(now);
            }
            let shown = format!("{event:?}");
            let got: Vec<String> = s.on(event, now).iter().map(brief).collect();
            assert_eq!(got, *want, "{name}, step {i}: {shown}");
        }
    }

    #[test]
    fn a_deletion_missed_while_down_is_confirmed_then_handled_once() {
        run(
            "restart",
            vec![rec("a", "1"), rec("b", "2")],
            vec![
                (Event::Tick, &[]),
                (reset(&[("a", "1")]), &["listed"]),
                (Event::Due, &["get:b"]),
                (Event::Due, &[]),
                (
                    looked("2", Lookup::Missing),
                    &["confirm:gone", "dispatch:b/snapshot"],
                ),
                (Event::Tick, &["write"]),
                (Event::Tick, &[]),
                (Event::Handled("2".into()), &[]),
                (Event::Tick, &["write"]),
                (Event::Stop, &["write"]),
            ],
        );
    }

    #[test]
    fn nothing_is_written_or_listed_before_the_first_complete_view() {
        run(
            "not listed",
            vec![rec("a", "1")],
            vec![
                (Event::Changed(vec![Membership::Remove(rec("a", "1"))]), &[]),
                (Event::Tick, &[]),
                (Event::Due, &[]),
                (Event::Stop, &[]),
            ],
        );
    }

    #[test]
    fn watch_deletions_retry_errors_and_take_another_uid_as_gone() {
        run(
            "watch",
            vec![],
            vec![
                (reset(&[("a", "1"), ("b", "2")]), &["listed"]),
                (Event::Tick, &["write"]),
                (Event::Changed(vec![Membership::Remove(rec("a", "1"))]), &[]),
                (Event::Due, &["get:a"]),
                (
                    looked("1", Lookup::Failed("timeout".into())),
                    &["confirm:error"],
                ),
                (Event::Due, &["get:a"]),
                (looked("1", Lookup::Uid(String::new())), &["confirm:error"]),
                (Event::Due, &["get:a"]),
                (
                    looked("1", Lookup::Uid("11".into())),
                    &["confirm:gone", "dispatch:a/watch"],
                ),
                // A late answer for nothing pending is counted, never dispatched.
                (looked("1", Lookup::Missing), &["confirm:gone"]),
                (Event::Tick, &["write"]),
            ],
        );
    }

    #[test]
    fn a_mass_deletion_is_held_and_one_live_node_refuses_it() {
        let ten: Vec<(String, String)> =
            (0..10).map(|i| (format!("n{i}"), i.to_string())).collect();
        let ten: Vec<(&str, &str)> = ten.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
        let t0 = Instant::now();
        let mut s = State::new(Pruner::new("me", vec![]), Confirmer::new(CFG, 7, t0));
        let acts = |s: &mut State, e| s.on(e, t0).iter().map(brief).collect::<Vec<_>>();
        assert_eq!(acts(&mut s, reset(&ten)), ["listed"]);
        assert_eq!(
            acts(
                &mut s,
                Event::Changed(vec![Membership::Reset(HashMap::new())])
            ),
            ["hold"]
        );
        assert_eq!((s.pending(), s.held(), s.len()), (10, 10, 0));
        let due = s.next_due().unwrap_or(t0);
        let first = match s.on(Event::Due, due).as_slice() {
            [Action::Lookup(first)] => first.clone(),
            other => panic!("one GET for a held batch, got {other:?}"),
        };
        let got: Vec<String> = s
            .on(looked(&first.uid, Lookup::Uid(first.uid.clone())), due)
            .iter()
            .map(brief)
            .collect();
        assert_eq!(got, ["confirm:live", "refused:10"]);
        assert_eq!((s.pending(), s.held(), s.len()), (0, 0, 10), "live again");
        assert_eq!(s.next_due(), None);
        assert_eq!(acts(&mut s, Event::Tick), ["write"]);
    }
}
