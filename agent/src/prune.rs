//! Stale-node pruning as a state machine: membership changes (from the
//! roster or a Node watch), confirmation answers, handler completions and
//! snapshot ticks in; the GETs, handler dispatches, snapshot writes and
//! counts they lead to out. No I/O: the caller passes the time and runs the
//! actions (`prune_loop`).
//!
//! Two parts: [`Pruner`] keeps the live set and diffs it against the
//! snapshot read at start; [`crate::confirm`] has the API server confirm
//! every deletion before a handler runs. [`State`] joins them, and holds a
//! confirmed deletion whose record shares a name, address, podCIDR or
//! providerID with anything live ([`crate::confirm::Holders`]) until
//! nothing live does: a handler never gets a live node's values.

use std::collections::HashMap;
use std::time::Instant;

use nodegate_roster::record::NodeRecord;
use nodegate_roster::view::Membership;
pub use nodegate_roster::view::NodeEvents;

use crate::confirm::{Confirmer, Conflict, Field, Holders, Lookup, Outcome};
use crate::deletion::DeleteSource;
pub use crate::deletion::{Deletion, key};

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
    /// Deleted nodes whose handlers have not finished, by [`key`]. They stay
    /// in the snapshot so a crash before the handler ran is retried at
    /// restart.
    unhandled: HashMap<String, NodeRecord>,
    /// The own node as the source last showed it, and as the API server
    /// did: never in the live set, never pruned, but what it holds is held.
    own_record: Option<NodeRecord>,
    own_api: Option<NodeRecord>,
    /// What live uids were seen with and their current record no longer
    /// carries (addresses, podCIDRs, providerID; a refused deletion's whole
    /// record when another uid took its name in the live set), by [`key`]:
    /// a source that strips a value from a live node's record does not free
    /// it. Dropped once the node is confirmed gone ([`Pruner::forget`]).
    dropped: HashMap<String, NodeRecord>,
    initialized: bool,
    dirty: bool,
}

/// Most values kept per node in [`Pruner`]'s dropped claims (a forged
/// source rewriting one record over and over cannot grow it without bound;
/// the first ones seen are kept).
const MAX_DROPPED: usize = 64;

impl Pruner {
    pub fn new(own: impl Into<String>, snapshot: Vec<NodeRecord>) -> Self {
        Self {
            own: own.into(),
            live: HashMap::new(),
            snapshot: Some(snapshot),
            unhandled: HashMap::new(),
            own_record: None,
            own_api: None,
            dropped: HashMap::new(),
            initialized: false,
            dirty: false,
        }
    }

    /// The own node's name.
    pub fn own(&self) -> &str {
        &self.own
    }

    /// Everything this pruner knows to be live, as records: the live set,
    /// the own node (as the source and the API server showed it) and the
    /// values live uids dropped. Deletions not yet confirmed are the
    /// confirmer's ([`Confirmer::pending_records`]).
    pub fn holders(&self) -> impl Iterator<Item = &NodeRecord> {
        self.live
            .values()
            .chain(self.own_record.iter())
            .chain(self.own_api.iter())
            .chain(self.dropped.values())
    }

    /// The own node as the API server has it.
    pub fn set_own_api(&mut self, r: NodeRecord) {
        if let Some(old) = self.own_api.take() {
            self.remember(&old, &r);
        }
        self.own_api = Some(r);
    }

    /// The node of deletion `k` ([`key`]) is confirmed gone: what it
    /// dropped is no longer held.
    pub fn forget(&mut self, k: &str) {
        self.dropped.remove(k);
    }

    /// A confirmed deletion is held for a conflict: out of the snapshot (a
    /// restart forgets it, so its handlers never run) until
    /// [`Pruner::unhold`].
    pub fn hold(&mut self, k: &str) {
        if self.unhandled.remove(k).is_some() {
            self.dirty = true;
        }
        self.forget(k);
    }

    /// A held deletion is confirmed again: back in the snapshot until
    /// handled.
    pub fn unhold(&mut self, r: NodeRecord) {
        self.unhandled.insert(key(&r), r);
        self.dirty = true;
    }

    /// `old` and `new` are records of one uid: what `old` carries and `new`
    /// does not stays held.
    fn remember(&mut self, old: &NodeRecord, new: &NodeRecord) {
        if old.uid != new.uid || old == new {
            return;
        }
        let addresses: Vec<_> = old
            .addresses
            .iter()
            .filter(|a| !new.addresses.iter().any(|b| b.address == a.address))
            .cloned()
            .collect();
        let cidrs: Vec<_> = old
            .pod_cidrs
            .iter()
            .filter(|c| !new.pod_cidrs.contains(c))
            .cloned()
            .collect();
        let provider = old
            .provider_id
            .clone()
            .filter(|p| new.provider_id.as_ref() != Some(p));
        if addresses.is_empty() && cidrs.is_empty() && provider.is_none() {
            return;
        }
        self.keep(NodeRecord {
            addresses,
            pod_cidrs: cidrs,
            provider_id: provider,
            ..old.clone()
        });
    }

    /// Adds what `r` carries to its dropped claims.
    fn keep(&mut self, r: NodeRecord) {
        let d = self.dropped.entry(key(&r)).or_insert_with(|| NodeRecord {
            name: r.name.clone(),
            uid: r.uid.clone(),
            addresses: Vec::new(),
            pod_cidrs: Vec::new(),
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        });
        for a in r.addresses {
            if d.addresses.len() < MAX_DROPPED
                && !d.addresses.iter().any(|b| b.address == a.address)
            {
                d.addresses.push(a);
            }
        }
        for c in r.pod_cidrs {
            if d.pod_cidrs.len() < MAX_DROPPED && !d.pod_cidrs.contains(&c) {
                d.pod_cidrs.push(c);
            }
        }
        if d.provider_id.is_none() {
            d.provider_id = r.provider_id;
        }
    }

    /// The own node's record from the source.
    fn set_own(&mut self, r: NodeRecord) {
        if let Some(old) = self.own_record.take() {
            self.remember(&old, &r);
        }
        self.own_record = Some(r);
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
            self.unhandled.remove(&key(&r));
            if r.name == self.own {
                // The API server has it: what it carries is held.
                self.keep(r);
            } else {
                match self.live.get(&r.name).cloned() {
                    None => {
                        self.live.insert(r.name.clone(), r);
                    }
                    Some(l) if l.uid == r.uid => self.remember(&r, &l),
                    // Another uid took the name in the live set: the API
                    // server says this one is live, so what it carries is held.
                    Some(_) => self.keep(r),
                }
            }
            self.dirty = true;
        }
    }

    /// The handlers are done with deletion `k` ([`key`]; successfully or
    /// not: failures are counted, never retried forever).
    pub fn handled(&mut self, k: &str) {
        if self.unhandled.remove(k).is_some() {
            self.dirty = true;
        }
    }

    /// Applies one membership change and returns the deletions it implies;
    /// they count as unhandled until [`Pruner::handled`].
    pub fn apply(&mut self, change: Membership) -> Vec<Deletion> {
        let deletions = self.apply_inner(change);
        for (r, _) in &deletions {
            self.unhandled.insert(key(r), r.clone());
            self.dirty = true;
        }
        deletions
    }

    /// Returns and clears "changed since the last snapshot write".
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty) && self.initialized
    }

    /// [`Pruner::remember`] for every record of `old` still listed under
    /// its uid.
    fn remember_all(&mut self, old: &[NodeRecord], listed: &HashMap<String, NodeRecord>) {
        for o in old {
            if let Some(l) = listed.get(&o.name) {
                self.remember(o, l);
            }
        }
    }

    fn apply_inner(&mut self, change: Membership) -> Vec<Deletion> {
        match change {
            Membership::Reset(mut listed) => {
                if let Some(own) = listed.remove(&self.own) {
                    self.set_own(own);
                }
                let deletions = match self.snapshot.take() {
                    // First complete view: whatever the snapshot has that is gone now.
                    Some(snap) => {
                        self.remember_all(&snap, &listed);
                        diff(snap, &listed, &self.own)
                            .into_iter()
                            .map(|r| (r, DeleteSource::Snapshot))
                            .collect()
                    }
                    // Complete again after a gap: deletions missed meanwhile.
                    None => {
                        let old: Vec<NodeRecord> = self.live.drain().map(|(_, r)| r).collect();
                        self.remember_all(&old, &listed);
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
                if r.name == self.own {
                    self.set_own(r);
                    return Vec::new();
                }
                if self.live.get(&r.name) == Some(&r) {
                    // Heartbeats and taint changes do not touch the record:
                    // no snapshot write for them.
                    return Vec::new();
                }
                if let Some(old) = self.live.get(&r.name).cloned() {
                    self.remember(&old, &r);
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
    /// The own node as the API server has it (read once at start): what it
    /// holds is held, whatever the source says.
    OwnNode(NodeRecord),
    /// The time [`State::next_due`] named has come.
    Due,
    /// The API server's answer to [`Action::Lookup`] of deletion `key`
    /// ([`key`]: the record's name and uid).
    Looked { key: String, result: Lookup },
    /// The handlers are done with deletion [`key`].
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
    /// [`Event::Looked`] for the record's [`key`].
    Lookup(NodeRecord),
    /// Run the handlers on a confirmed deletion; answer with
    /// [`Event::Handled`] when they are done. Its record shares nothing
    /// with anything live.
    Dispatch(Deletion),
    /// Write [`State::records`] as the snapshot.
    WriteSnapshot,
    /// The first complete view of the nodes is in (the agent is ready).
    Listed,
    /// A mass deletion was held.
    CountHold,
    /// One confirmation concluded: `gone` (handled), `live` (refused),
    /// `error` (asked again) or, held for a conflict, one of
    /// [`Field::result`].
    CountConfirmation(&'static str),
    /// Deletions refused: the API server still has those nodes.
    CountRefused(u64),
}

/// A confirmed deletion held because something live holds a value of its
/// record.
#[derive(Debug)]
struct Held {
    deletion: Deletion,
    conflict: Conflict,
    /// The uid the API server named as the holder of the record's name:
    /// asked again only once that node's own deletion was handled (the
    /// agent may not know it otherwise).
    waits_for: Option<String>,
}

/// The pruning's memory between events.
#[derive(Debug)]
pub struct State {
    nodes: Pruner,
    confirmer: Confirmer,
    listed: bool,
    /// Held deletions by [`key`].
    held: HashMap<String, Held>,
}

impl State {
    pub fn new(nodes: Pruner, confirmer: Confirmer) -> Self {
        Self {
            nodes,
            confirmer,
            listed: false,
            held: HashMap::new(),
        }
    }

    /// Feeds one event at `now`; returns what to do.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Changed(changes) => {
                let known = self.nodes.known();
                let mut deletions: Vec<Deletion> = changes
                    .into_iter()
                    .flat_map(|c| self.nodes.apply(c))
                    .collect();
                // Already confirmed gone and held: not asked again for it.
                deletions.retain(|(r, _)| {
                    let k = key(r);
                    let held = self.held.contains_key(&k);
                    if held {
                        self.nodes.hold(&k);
                    }
                    !held
                });
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
            Event::OwnNode(r) => self.nodes.set_own_api(r),
            Event::Due => out.extend(self.confirmer.start(now).map(Action::Lookup)),
            Event::Looked { key, result } => self.conclude(&key, result, now, &mut out),
            Event::Handled(k) => self.nodes.handled(&k),
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

    /// Everything live: the pruner's holders and the deletions the API
    /// server has not confirmed yet.
    fn holders(&self) -> Holders<'_> {
        Holders::new(self.nodes.holders().chain(self.confirmer.pending_records()))
    }

    /// Acts on a confirmation's answer.
    fn conclude(&mut self, k: &str, result: Lookup, now: Instant, out: &mut Vec<Action>) {
        match self.confirmer.finish(k, result.clone(), now) {
            Outcome::Gone(d) => {
                match self.holders().conflict(&d.0) {
                    None => {
                        out.push(Action::CountConfirmation("gone"));
                        self.dispatch(d, out);
                    }
                    Some(c) => {
                        out.push(Action::CountConfirmation(c.field.result()));
                        self.hold(d, c, None);
                    }
                }
                self.reexamine(now);
            }
            Outcome::NameHeld { deletion, holder } => {
                out.push(Action::CountConfirmation(Field::Name.result()));
                let c = Conflict::name_held(&deletion.0, &holder);
                self.hold(deletion, c, Some(holder));
                self.reexamine(now);
            }
            Outcome::Live(records) => {
                out.push(Action::CountConfirmation("live"));
                out.push(Action::CountRefused(records.len() as u64));
                let names: Vec<&str> = records.iter().take(5).map(|r| r.name.as_str()).collect();
                tracing::error!(refused = records.len(), first = ?names, "the node source reported live nodes deleted (the API server still has them with those uids): no handler runs; a forged roster shard?");
                self.nodes.restore(records);
            }
            Outcome::Retry => {
                out.push(Action::CountConfirmation("error"));
                if let Lookup::Failed(e) = &result {
                    tracing::warn!(deletion = %k, error = %e, "cannot confirm a deletion with the API server; retrying later");
                }
            }
            // A late answer for nothing pending: counted as it came.
            Outcome::Unknown => out.push(Action::CountConfirmation(match &result {
                Lookup::Missing => "gone",
                Lookup::Uid(u) if k.rsplit('/').next() == Some(u.as_str()) => "live",
                Lookup::Uid(u) if !u.is_empty() => Field::Name.result(),
                Lookup::Uid(_) | Lookup::Failed(_) => "error",
            })),
        }
    }

    /// Hands a deletion that passed every check to the handlers.
    fn dispatch(&mut self, d: Deletion, out: &mut Vec<Action>) {
        let (name, uid) = (&d.0.name, &d.0.uid);
        self.nodes.forget(&key(&d.0));
        // The node a held record's name waited for is gone.
        for h in self.held.values_mut() {
            if h.waits_for.as_ref() == Some(uid) && &h.deletion.0.name == name {
                h.waits_for = None;
            }
        }
        out.push(Action::Dispatch(d));
    }

    /// Holds a confirmed deletion for `c`: no handler, out of the snapshot,
    /// asked again once nothing live holds its values.
    fn hold(&mut self, d: Deletion, c: Conflict, waits_for: Option<String>) {
        let (r, source) = (&d.0, d.1);
        tracing::warn!(
            node = %r.name,
            uid = %r.uid,
            %source,
            field = c.field.as_str(),
            value = %c.value,
            holder = %c.holder,
            holder_uid = %c.holder_uid,
            "deletion held, no handler runs: a live node holds a value of this record (a node re-created under its name, an address or podCIDR reused, or a forged roster record)"
        );
        self.nodes.hold(&key(r));
        self.held.insert(
            key(r),
            Held {
                deletion: d,
                conflict: c,
                waits_for,
            },
        );
    }

    /// Asks again (a GET, at the pace) for every held deletion that nothing
    /// live holds a value of any more: their holders were confirmed gone.
    fn reexamine(&mut self, now: Instant) {
        if self.held.is_empty() {
            return;
        }
        let free: Vec<String> = {
            let holders = self.holders();
            self.held
                .iter()
                .filter(|(_, h)| h.waits_for.is_none())
                .filter(|(_, h)| holders.conflict(&h.deletion.0).is_none())
                .map(|(u, _)| u.clone())
                .collect()
        };
        let mut again = Vec::new();
        for k in free {
            if let Some(h) = self.held.remove(&k) {
                tracing::info!(node = %h.deletion.0.name, uid = %h.deletion.0.uid, field = h.conflict.field.as_str(), value = %h.conflict.value, "nothing live holds a held deletion's values any more: confirming it again");
                self.nodes.unhold(h.deletion.0.clone());
                again.push(h.deletion);
            }
        }
        self.confirmer.requeue(again, now);
    }

    /// When to send [`Event::Due`] next; `None`: no confirmation to start.
    pub fn next_due(&self) -> Option<Instant> {
        self.confirmer.next_due()
    }

    /// The own node's name.
    pub fn own(&self) -> &str {
        self.nodes.own()
    }

    /// What the snapshot holds: live nodes and deletions not yet handled
    /// (held ones excepted).
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

    /// Confirmed deletions held because a live node holds a value of their
    /// record (never handled while it does).
    pub fn conflicted(&self) -> usize {
        self.held.len()
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

    /// A podCIDR of its own per name (every incarnation of a name has it).
    fn cidr(name: &str) -> String {
        let h = shard::shard_of(name, 1 << 16);
        format!("10.{}.{}.0/24", h >> 8, h & 0xff)
    }

    fn rec(name: &str, uid: &str) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            uid: uid.into(),
            addresses: vec![],
            pod_cidrs: vec![cidr(name)],
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        }
    }

    fn node(name: &str, uid: &str) -> NodeResource {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": uid},
            "spec": {"podCIDR": cidr(name)}}))
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
        p.handled("b/2");
        assert!(p.take_dirty(), "handled deletions rewrite the snapshot");
        p.handled("a/1");
        assert_eq!(p.records().count(), 0);
        assert!(p.take_dirty());
        p.handled("a/1");
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
            match c.finish(&key(&r), answer, at) {
                Outcome::Gone(d) => {
                    p.handled(&key(&d.0));
                    out.push(d);
                }
                Outcome::Live(rs) => p.restore(rs),
                Outcome::NameHeld { deletion, .. } => p.hold(&key(&deletion.0)),
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

    fn looked(key: &str, result: Lookup) -> Event {
        Event::Looked {
            key: key.into(),
            result,
        }
    }

    /// Runs `steps` (event, the actions it must give) through a fresh state
    /// with `snapshot`; [`Event::Due`] comes at the time the state named.
    fn run(name: &str, snapshot: Vec<NodeRecord>, steps: Vec<(Event, &[&str])>) -> State {
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
        s
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
                    looked("b/2", Lookup::Missing),
                    &["confirm:gone", "dispatch:b/snapshot"],
                ),
                (Event::Tick, &["write"]),
                (Event::Tick, &[]),
                (Event::Handled("b/2".into()), &[]),
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

    /// Errors are asked again; a name the API server has under another uid
    /// (re-created) holds the deletion until that node is gone too, then
    /// both are handled, the old incarnation last.
    #[test]
    fn watch_deletions_retry_errors_and_hold_a_name_taken_by_another_uid() {
        run(
            "watch",
            vec![],
            vec![
                (reset(&[("a", "1"), ("b", "2")]), &["listed"]),
                (Event::Tick, &["write"]),
                (Event::Changed(vec![Membership::Remove(rec("a", "1"))]), &[]),
                (Event::Due, &["get:a"]),
                (
                    looked("a/1", Lookup::Failed("timeout".into())),
                    &["confirm:error"],
                ),
                (Event::Due, &["get:a"]),
                (
                    looked("a/1", Lookup::Uid(String::new())),
                    &["confirm:error"],
                ),
                (Event::Due, &["get:a"]),
                // Re-created under its name: held, no handler.
                (
                    looked("a/1", Lookup::Uid("11".into())),
                    &["confirm:conflict_name"],
                ),
                (Event::Due, &[]),
                (Event::Tick, &["write"]),
                // The new incarnation joins and leaves: handled, and then
                // the held one is asked again and handled.
                (
                    Event::Changed(vec![Membership::Upsert(rec("a", "11"))]),
                    &[],
                ),
                (
                    Event::Changed(vec![Membership::Remove(rec("a", "11"))]),
                    &[],
                ),
                (Event::Due, &["get:a"]),
                (
                    looked("a/11", Lookup::Missing),
                    &["confirm:gone", "dispatch:a/watch"],
                ),
                (Event::Due, &["get:a"]),
                (
                    looked("a/1", Lookup::Missing),
                    &["confirm:gone", "dispatch:a/watch"],
                ),
                // A late answer for nothing pending is counted, never dispatched.
                (looked("a/1", Lookup::Missing), &["confirm:gone"]),
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
            .on(looked(&key(&first), Lookup::Uid(first.uid.clone())), due)
            .iter()
            .map(brief)
            .collect();
        assert_eq!(got, ["confirm:live", "refused:10"]);
        assert_eq!((s.pending(), s.held(), s.len()), (0, 0, 10), "live again");
        assert_eq!(s.next_due(), None);
        assert_eq!(acts(&mut s, Event::Tick), ["write"]);
    }

    // ---- A roster writer's records never reach a handler with a live
    // node's values ----

    /// A record with an InternalIP (and a podCIDR of its own unless given).
    fn with(name: &str, uid: &str, ip: &str, pod_cidr: Option<&str>) -> NodeRecord {
        NodeRecord {
            addresses: vec![nodegate_roster::record::NodeAddress {
                kind: "InternalIP".into(),
                address: ip.into(),
            }],
            pod_cidrs: vec![pod_cidr.map_or_else(|| cidr(name), str::to_string)],
            ..rec(name, uid)
        }
    }

    fn changed(m: Membership) -> Event {
        Event::Changed(vec![m])
    }

    /// Live: `a` (10.1.0.1, 10.244.1.0/24) and `b` (10.1.0.2, 10.244.2.0/24).
    fn a_and_b() -> Event {
        Event::Changed(vec![Membership::Reset(
            [
                with("a", "1", "10.1.0.1", Some("10.244.1.0/24")),
                with("b", "2", "10.1.0.2", Some("10.244.2.0/24")),
            ]
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect(),
        )])
    }

    fn no_handler_for(s: &State, name: &str) {
        assert!(
            !s.records().any(|r| r.name == name),
            "a held record leaves the snapshot"
        );
    }

    /// (a) A ghost (a name the API server never had) carrying a live
    /// node's InternalIP, written to the roster and removed: the GET says
    /// 404, the IP is `a`'s: held, counted, never dispatched. Also in
    /// another spelling of the same address (IPv4-mapped IPv6).
    #[test]
    fn a_ghost_with_a_live_nodes_ip_is_held() {
        for ip in ["10.1.0.1", "::ffff:10.1.0.1"] {
            let ghost = with("ghost", "g", ip, Some("10.244.99.0/24"));
            let s = run(
                ip,
                vec![],
                vec![
                    (a_and_b(), &["listed"]),
                    (changed(Membership::Upsert(ghost.clone())), &[]),
                    (changed(Membership::Remove(ghost)), &[]),
                    (Event::Due, &["get:ghost"]),
                    (
                        looked("ghost/g", Lookup::Missing),
                        &["confirm:conflict_address"],
                    ),
                    (Event::Due, &[]),
                ],
            );
            assert_eq!((s.conflicted(), s.pending(), s.len()), (1, 0, 2));
            no_handler_for(&s, "ghost");
        }
    }

    /// (b) A ghost carrying a live node's podCIDR, or a part of it, or a
    /// range covering it: held.
    #[test]
    fn a_ghost_with_a_live_nodes_pod_cidr_is_held() {
        for c in ["10.244.2.0/24", "10.244.2.128/25", "10.244.0.0/16"] {
            let ghost = with("ghost", "g", "10.1.9.9", Some(c));
            let s = run(
                c,
                vec![],
                vec![
                    (a_and_b(), &["listed"]),
                    (changed(Membership::Upsert(ghost.clone())), &[]),
                    (changed(Membership::Remove(ghost)), &[]),
                    (Event::Due, &["get:ghost"]),
                    (
                        looked("ghost/g", Lookup::Missing),
                        &["confirm:conflict_pod_cidr"],
                    ),
                ],
            );
            assert_eq!(s.conflicted(), 1);
            no_handler_for(&s, "ghost");
        }
    }

    /// (c) A live node's record with a swapped uid: the forged uid's
    /// arrival makes `a`'s real uid look deleted (refused: live), and the
    /// real record's return makes the forged uid look deleted. The API
    /// server has `a` under its real uid: held, never handled with `a`'s
    /// name — whether the forged record carries `a`'s addresses or none.
    #[test]
    fn a_live_nodes_record_with_a_swapped_uid_is_held() {
        let real = with("a", "1", "10.1.0.1", Some("10.244.1.0/24"));
        let full = NodeRecord {
            uid: "1x".into(),
            ..real.clone()
        };
        let bare = NodeRecord {
            addresses: vec![],
            pod_cidrs: vec![],
            ..full.clone()
        };
        for forged in [full, bare] {
            let s = run(
                "swapped",
                vec![],
                vec![
                    (a_and_b(), &["listed"]),
                    (changed(Membership::Upsert(forged.clone())), &[]),
                    (Event::Due, &["get:a"]),
                    (
                        looked("a/1", Lookup::Uid("1".into())),
                        &["confirm:live", "refused:1"],
                    ),
                    // The publisher repairs the shard.
                    (changed(Membership::Upsert(real.clone())), &[]),
                    (Event::Due, &["get:a"]),
                    (
                        looked("a/1x", Lookup::Uid("1".into())),
                        &["confirm:conflict_name"],
                    ),
                    (Event::Due, &[]),
                ],
            );
            assert_eq!(s.conflicted(), 1);
            assert!(s.records().all(|r| r.uid != "1x"));
        }
    }

    /// A source that strips the IP from a live node's record before
    /// publishing a ghost with it does not free the IP: what a live uid was
    /// seen with stays held until that uid is confirmed gone.
    #[test]
    fn an_address_stripped_from_a_live_record_stays_held() {
        let stripped = NodeRecord {
            addresses: vec![],
            ..with("a", "1", "10.1.0.1", Some("10.244.1.0/24"))
        };
        let ghost = with("ghost", "g", "10.1.0.1", Some("10.244.99.0/24"));
        let s = run(
            "stripped",
            vec![],
            vec![
                (a_and_b(), &["listed"]),
                (changed(Membership::Upsert(stripped)), &[]),
                (changed(Membership::Upsert(ghost.clone())), &[]),
                (changed(Membership::Remove(ghost)), &[]),
                (Event::Due, &["get:ghost"]),
                (
                    looked("ghost/g", Lookup::Missing),
                    &["confirm:conflict_address"],
                ),
            ],
        );
        assert_eq!(s.conflicted(), 1);
    }

    /// The own node is never in the live set, but what it holds is held:
    /// as the API server has it (read at start) and as the source shows it.
    #[test]
    fn the_own_nodes_values_are_held() {
        let ghost = with("ghost", "g", "10.1.0.100", Some("10.244.99.0/24"));
        let own_from_api = with("me", "0", "10.1.0.100", Some("10.244.100.0/24"));
        let s = run(
            "own",
            vec![],
            vec![
                (Event::OwnNode(own_from_api), &[]),
                (a_and_b(), &["listed"]),
                (changed(Membership::Upsert(ghost.clone())), &[]),
                (changed(Membership::Remove(ghost)), &[]),
                (Event::Due, &["get:ghost"]),
                (
                    looked("ghost/g", Lookup::Missing),
                    &["confirm:conflict_address"],
                ),
            ],
        );
        assert_eq!(s.conflicted(), 1);
        let ghost = with("ghost", "g", "10.1.9.9", Some("10.244.100.0/26"));
        let own_from_roster = with("me", "0", "10.1.0.100", Some("10.244.100.0/24"));
        run(
            "own in the roster",
            vec![],
            vec![
                (a_and_b(), &["listed"]),
                (changed(Membership::Upsert(own_from_roster)), &[]),
                (changed(Membership::Upsert(ghost.clone())), &[]),
                (changed(Membership::Remove(ghost)), &[]),
                (Event::Due, &["get:ghost"]),
                (
                    looked("ghost/g", Lookup::Missing),
                    &["confirm:conflict_pod_cidr"],
                ),
            ],
        );
    }

    /// A deletion not yet confirmed may be a live node: what it holds is
    /// held. A forged change removing `a` and a ghost with `a`'s IP at once
    /// runs nothing, whichever the API server is asked about first.
    #[test]
    fn an_unconfirmed_deletion_still_holds_its_values() {
        for seed in 0..8 {
            let t0 = Instant::now();
            let mut s = State::new(Pruner::new("me", vec![]), Confirmer::new(CFG, seed, t0));
            let ghost = with("ghost", "g", "10.1.0.1", Some("10.244.99.0/24"));
            s.on(a_and_b(), t0);
            s.on(changed(Membership::Upsert(ghost.clone())), t0);
            s.on(
                Event::Changed(vec![
                    Membership::Remove(with("a", "1", "10.1.0.1", Some("10.244.1.0/24"))),
                    Membership::Remove(ghost),
                ]),
                t0,
            );
            let mut acts = Vec::new();
            while let Some(at) = s.next_due() {
                for a in s.on(Event::Due, at) {
                    let Action::Lookup(r) = a else { continue };
                    let answer = if r.name == "a" {
                        Lookup::Uid("1".into())
                    } else {
                        Lookup::Missing
                    };
                    acts.extend(s.on(looked(&key(&r), answer), at).iter().map(brief));
                }
            }
            assert!(
                acts.iter().all(|a| !a.starts_with("dispatch")),
                "seed {seed}: {acts:?}"
            );
            assert!(acts.contains(&"confirm:conflict_address".to_string()));
            assert_eq!(
                (s.conflicted(), s.len()),
                (1, 2),
                "seed {seed}: a is live again"
            );
        }
    }

    /// A held deletion is asked again once its holder is confirmed gone,
    /// and handled then (an IP reused by a node that later left too).
    #[test]
    fn a_held_deletion_is_handled_once_its_holder_is_gone() {
        let ghost = with("ghost", "g", "10.1.0.1", Some("10.244.99.0/24"));
        let s = run(
            "release",
            vec![],
            vec![
                (a_and_b(), &["listed"]),
                (changed(Membership::Upsert(ghost.clone())), &[]),
                (changed(Membership::Remove(ghost)), &[]),
                (Event::Due, &["get:ghost"]),
                (
                    looked("ghost/g", Lookup::Missing),
                    &["confirm:conflict_address"],
                ),
                (
                    changed(Membership::Remove(with(
                        "a",
                        "1",
                        "10.1.0.1",
                        Some("10.244.1.0/24"),
                    ))),
                    &[],
                ),
                (Event::Due, &["get:a"]),
                (
                    looked("a/1", Lookup::Missing),
                    &["confirm:gone", "dispatch:a/watch"],
                ),
                (Event::Due, &["get:ghost"]),
                (
                    looked("ghost/g", Lookup::Missing),
                    &["confirm:gone", "dispatch:ghost/watch"],
                ),
                (Event::Due, &[]),
            ],
        );
        assert_eq!((s.conflicted(), s.pending()), (0, 0));
    }

    /// At restart, a node deleted while the agent was down whose IP a node
    /// that joined meanwhile got (the IP reused) is held, not handled; the
    /// other deletion is handled.
    #[test]
    fn a_snapshot_deletion_whose_ip_was_reused_is_held() {
        let snap = vec![
            with("a", "1", "10.1.0.1", Some("10.244.1.0/24")),
            with("old", "3", "10.1.0.3", Some("10.244.3.0/24")),
            with("gone", "4", "10.1.0.4", Some("10.244.4.0/24")),
        ];
        let reset = Event::Changed(vec![Membership::Reset(
            [
                with("a", "1", "10.1.0.1", Some("10.244.1.0/24")),
                with("new", "5", "10.1.0.3", Some("10.244.5.0/24")),
            ]
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect(),
        )]);
        let t0 = Instant::now();
        let mut s = State::new(Pruner::new("me", snap), Confirmer::new(CFG, 7, t0));
        assert_eq!(
            s.on(reset, t0).iter().map(brief).collect::<Vec<_>>(),
            ["listed"]
        );
        let mut acts = Vec::new();
        while let Some(at) = s.next_due() {
            for a in s.on(Event::Due, at) {
                if let Action::Lookup(r) = a {
                    acts.extend(
                        s.on(looked(&key(&r), Lookup::Missing), at)
                            .iter()
                            .map(brief),
                    );
                }
            }
        }
        acts.sort();
        assert_eq!(
            acts,
            [
                "confirm:conflict_address",
                "confirm:gone",
                "dispatch:gone/snapshot"
            ]
        );
        assert_eq!(s.conflicted(), 1);
    }

    /// A ghost carrying a live node's uid as well as its IP is not that
    /// node: it does not stand in for `a`'s own deletion (tracked by name
    /// and uid), and `a`'s IP stays held, whether the forged change removes
    /// `a` with it or not.
    #[test]
    fn a_ghost_borrowing_a_live_nodes_uid_is_held() {
        let a = with("a", "1", "10.1.0.1", Some("10.244.1.0/24"));
        let ghost = NodeRecord {
            name: "ghost".into(),
            pod_cidrs: vec!["10.244.99.0/24".into()],
            ..a.clone()
        };
        for remove_a_too in [false, true] {
            for seed in 0..8 {
                let t0 = Instant::now();
                let mut s = State::new(Pruner::new("me", vec![]), Confirmer::new(CFG, seed, t0));
                s.on(a_and_b(), t0);
                s.on(changed(Membership::Upsert(ghost.clone())), t0);
                let mut gone = vec![Membership::Remove(ghost.clone())];
                if remove_a_too {
                    gone.push(Membership::Remove(a.clone()));
                }
                s.on(Event::Changed(gone), t0);
                let mut acts = Vec::new();
                while let Some(at) = s.next_due() {
                    for act in s.on(Event::Due, at) {
                        let Action::Lookup(r) = act else { continue };
                        let answer = if r.name == "a" {
                            Lookup::Uid("1".into())
                        } else {
                            Lookup::Missing
                        };
                        acts.extend(s.on(looked(&key(&r), answer), at).iter().map(brief));
                    }
                }
                let want_gets = 1 + usize::from(remove_a_too);
                assert_eq!(
                    acts.iter().filter(|a| a.starts_with("confirm:")).count(),
                    want_gets,
                    "{remove_a_too} {seed}: {acts:?}"
                );
                assert!(
                    acts.iter().all(|a| !a.starts_with("dispatch")),
                    "{remove_a_too} {seed}: {acts:?}"
                );
                assert!(acts.contains(&"confirm:conflict_address".to_string()));
                assert_eq!((s.conflicted(), s.len()), (1, 2), "a is live");
            }
        }
    }
}
