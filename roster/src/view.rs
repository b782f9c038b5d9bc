//! A reader's view of the roster: the shards it has seen, whether they form
//! a complete set, and the membership changes that follow from each event.
//!
//! Nothing is reported while the view is incomplete (publisher down, a
//! shard missing, corrupt or of an older epoch): a pruner that sees no
//! change prunes nothing. When the view becomes complete again, the whole
//! set is reported at once ([`Membership::Reset`]) and diffed by the pruner.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use nodegate_shared::NodeResource;

use crate::record::NodeRecord;
use crate::shard::{self, Shard, ShardError};

/// A change of the set of nodes, whatever its source (Node watch or roster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Membership {
    /// The complete set, by name: after a (re)list, or when the roster
    /// becomes complete again.
    Reset(HashMap<String, NodeRecord>),
    /// A node joined or its record changed (a new uid means the old
    /// incarnation is gone).
    Upsert(NodeRecord),
    /// A node left.
    Remove(NodeRecord),
}

/// Turns a Node watch into membership changes: a list (between `Init` and
/// `InitDone`) becomes one [`Membership::Reset`].
#[derive(Debug, Default)]
pub struct NodeEvents {
    listing: Option<HashMap<String, NodeRecord>>,
}

impl NodeEvents {
    pub fn apply(&mut self, event: watcher::Event<NodeResource>) -> Option<Membership> {
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                None
            }
            watcher::Event::InitApply(node) => {
                if let Some(r) = NodeRecord::from_view(&node.view) {
                    self.listing
                        .get_or_insert_with(HashMap::new)
                        .insert(r.name.clone(), r);
                }
                None
            }
            watcher::Event::InitDone => {
                Some(Membership::Reset(self.listing.take().unwrap_or_default()))
            }
            watcher::Event::Apply(node) => {
                NodeRecord::from_view(&node.view).map(Membership::Upsert)
            }
            watcher::Event::Delete(node) => {
                NodeRecord::from_view(&node.view).map(Membership::Remove)
            }
        }
    }
}

/// What one roster event did.
#[derive(Debug, Default)]
pub struct Step {
    pub changes: Vec<Membership>,
    /// Shards that could not be trusted, by ConfigMap name.
    pub rejected: Vec<(String, ShardError)>,
    /// `Some(complete)` when this event made the view complete or
    /// incomplete (it starts incomplete).
    pub complete: Option<bool>,
}

#[derive(Debug)]
pub struct RosterView {
    /// The roster's name (shard prefix).
    roster: String,
    /// Trusted shards by ConfigMap name: the only copy of the records.
    shards: HashMap<String, Shard>,
    /// Shards of a list in progress.
    listing: Option<HashMap<String, Shard>>,
    /// `(epoch, shard count)` of the complete view; `None` while incomplete.
    complete: Option<(u64, u32)>,
}

impl RosterView {
    pub fn new(roster: impl Into<String>) -> Self {
        Self {
            roster: roster.into(),
            shards: HashMap::new(),
            listing: None,
            complete: None,
        }
    }

    /// True while the shards seen form a complete roster.
    pub fn is_complete(&self) -> bool {
        self.complete.is_some()
    }

    /// Trusted shards held (of any epoch).
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Applies one watcher event on the shard ConfigMaps.
    pub fn apply(&mut self, event: watcher::Event<ConfigMap>) -> Step {
        let mut step = Step::default();
        let before = self.complete;
        // The previous versions of the shards this event replaced, and the
        // names to compare them with (`None`: every shard, after a relist).
        let (old, changed): (Vec<Shard>, Option<String>) = match event {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                return step;
            }
            watcher::Event::InitApply(cm) => {
                let name = cm.metadata.name.clone().unwrap_or_default();
                match shard::decode(&self.roster, &cm) {
                    Ok(s) => {
                        self.listing
                            .get_or_insert_with(HashMap::new)
                            .insert(name, s);
                    }
                    Err(e) => step.rejected.push((name, e)),
                }
                return step;
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.shards, listed);
                (old.into_values().collect(), None)
            }
            watcher::Event::Apply(cm) => {
                let name = cm.metadata.name.clone().unwrap_or_default();
                let old = match shard::decode(&self.roster, &cm) {
                    Ok(s) => self.shards.insert(name.clone(), s),
                    Err(e) => {
                        // Untrusted replaces trusted: that shard is now missing.
                        step.rejected.push((name.clone(), e));
                        self.shards.remove(&name)
                    }
                };
                (old.into_iter().collect(), Some(name))
            }
            watcher::Event::Delete(cm) => {
                let name = cm.metadata.name.clone().unwrap_or_default();
                (self.shards.remove(&name).into_iter().collect(), Some(name))
            }
        };
        self.complete = self.complete_key();
        if before.is_some() != self.complete.is_some() {
            step.complete = Some(self.complete.is_some());
        }
        step.changes = match self.complete {
            None => Vec::new(),
            // Complete again, or a new epoch: the whole set.
            Some(key) if before != Some(key) => vec![Membership::Reset(self.members(key))],
            // Still the same complete view: only the shards replaced differ.
            Some(key) => self.diff(key, &old, changed.as_deref()),
        };
        step
    }

    fn complete_key(&self) -> Option<(u64, u32)> {
        shard::complete_epoch(self.shards.values())
    }

    fn current(&self, key: (u64, u32)) -> impl Iterator<Item = &Shard> {
        self.shards
            .values()
            .filter(move |s| (s.epoch, s.count) == key)
    }

    /// The union of the complete view's shards.
    fn members(&self, key: (u64, u32)) -> HashMap<String, NodeRecord> {
        self.current(key)
            .flat_map(|s| s.nodes.values())
            .map(|r| (r.name.clone(), r.clone()))
            .collect()
    }

    /// What changed between the replaced shards `old` and the current
    /// versions of `changed` (every shard when `None`), within the view.
    fn diff(&self, key: (u64, u32), old: &[Shard], changed: Option<&str>) -> Vec<Membership> {
        let in_view = |s: &&Shard| (s.epoch, s.count) == key;
        let before: HashMap<&str, &NodeRecord> = old
            .iter()
            .filter(in_view)
            .flat_map(|s| s.nodes.values())
            .map(|r| (r.name.as_str(), r))
            .collect();
        let after: HashMap<&str, &NodeRecord> = match changed {
            Some(name) => self.shards.get(name).into_iter().filter(in_view).collect(),
            None => self.current(key).collect::<Vec<_>>(),
        }
        .into_iter()
        .flat_map(|s| s.nodes.values())
        .map(|r| (r.name.as_str(), r))
        .collect();
        let mut out: Vec<Membership> = before
            .iter()
            .filter(|(n, _)| !after.contains_key(*n))
            .map(|(_, r)| Membership::Remove((*r).clone()))
            .collect();
        out.extend(
            after
                .iter()
                .filter(|(n, r)| before.get(*n) != Some(*r))
                .map(|(_, r)| Membership::Upsert((*r).clone())),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::{self, config_map, encode, shard_of};

    fn rec(name: &str, uid: &str) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            uid: uid.into(),
            addresses: vec![],
            pod_cidrs: vec![],
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        }
    }

    /// Shard `i` of `count` at `epoch` holding those of `nodes` that belong there.
    fn shard(epoch: u64, i: u32, count: u32, nodes: &[(&str, &str)]) -> ConfigMap {
        let recs: Vec<NodeRecord> = nodes
            .iter()
            .filter(|(n, _)| shard_of(n, count) == i)
            .map(|(n, u)| rec(n, u))
            .collect();
        config_map(
            "nodegate",
            shard::DEFAULT_NAME,
            i,
            encode(epoch, i, count, &recs),
        )
    }

    fn list(v: &mut RosterView, cms: Vec<ConfigMap>) -> Vec<Membership> {
        assert!(v.apply(watcher::Event::Init).changes.is_empty());
        for cm in cms {
            assert!(v.apply(watcher::Event::InitApply(cm)).changes.is_empty());
        }
        v.apply(watcher::Event::InitDone).changes
    }

    fn reset_names(c: &[Membership]) -> Vec<(String, String)> {
        let [Membership::Reset(m)] = c else {
            panic!("expected one Reset, got {c:?}")
        };
        let mut v: Vec<_> = m
            .values()
            .map(|r| (r.name.clone(), r.uid.clone()))
            .collect();
        v.sort();
        v
    }

    const NODES: &[(&str, &str)] = &[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "5")];

    /// What a step reports: the completeness change, and the changes as
    /// text (`reset:N`, `+name`, `-name`), sorted.
    fn summary(step: &Step) -> (Option<bool>, usize, Vec<String>) {
        let mut changes: Vec<String> = step
            .changes
            .iter()
            .map(|m| match m {
                Membership::Reset(all) => format!("reset:{}", all.len()),
                Membership::Upsert(r) => format!("+{}", r.name),
                Membership::Remove(r) => format!("-{}", r.name),
            })
            .collect();
        changes.sort();
        (step.complete, step.rejected.len(), changes)
    }

    /// The view as a state machine, one event at a time: whether it became
    /// complete or incomplete, how many shards it rejected, and the
    /// membership changes it reported.
    #[test]
    fn every_transition_one_event_at_a_time() {
        let with_f: Vec<(&str, &str)> = NODES.iter().copied().chain([("f", "6")]).collect();
        let f_shard = shard_of("f", 2);
        let corrupt = config_map("nodegate", shard::DEFAULT_NAME, 1, "not json".into());
        let cm_name = |cm: &ConfigMap| cm.metadata.name.clone().unwrap_or_default();
        let s1 = shard(1, 1, 2, NODES);
        type Row = (
            &'static str,
            watcher::Event<ConfigMap>,
            (Option<bool>, usize, Vec<&'static str>),
        );
        let table: Vec<Row> = vec![
            ("list starts", watcher::Event::Init, (None, 0, vec![])),
            (
                "one shard listed",
                watcher::Event::InitApply(shard(1, 0, 2, NODES)),
                (None, 0, vec![]),
            ),
            (
                "list ends incomplete",
                watcher::Event::InitDone,
                (None, 0, vec![]),
            ),
            (
                "last shard arrives",
                watcher::Event::Apply(s1.clone()),
                (Some(true), 0, vec!["reset:5"]),
            ),
            (
                "same shard again",
                watcher::Event::Apply(s1.clone()),
                (None, 0, vec![]),
            ),
            (
                "a shard is deleted",
                watcher::Event::Delete(s1.clone()),
                (Some(false), 0, vec![]),
            ),
            (
                "it comes back",
                watcher::Event::Apply(s1.clone()),
                (Some(true), 0, vec!["reset:5"]),
            ),
            (
                "it turns corrupt",
                watcher::Event::Apply(corrupt.clone()),
                (Some(false), 1, vec![]),
            ),
            (
                "a new epoch begins",
                watcher::Event::Apply(shard(2, 0, 2, NODES)),
                (None, 0, vec![]),
            ),
            (
                "and completes",
                watcher::Event::Apply(shard(2, 1, 2, NODES)),
                (Some(true), 0, vec!["reset:5"]),
            ),
            (
                "a node joins",
                watcher::Event::Apply(shard(2, f_shard, 2, &with_f)),
                (None, 0, vec!["+f"]),
            ),
            (
                "and leaves",
                watcher::Event::Apply(shard(2, f_shard, 2, NODES)),
                (None, 0, vec!["-f"]),
            ),
        ];
        assert_eq!(cm_name(&corrupt), cm_name(&s1));
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        for (what, event, (complete, rejected, changes)) in table {
            let got = summary(&v.apply(event));
            let want = (
                complete,
                rejected,
                changes.iter().map(|s| s.to_string()).collect(),
            );
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn complete_list_is_one_reset_then_diffs() {
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        let c = list(&mut v, (0..3).map(|i| shard(1, i, 3, NODES)).collect());
        assert_eq!(reset_names(&c).len(), 5);
        assert!(v.is_complete());
        // "c" leaves, "f" joins, "a" is re-created: only their shards change.
        let after: Vec<(&str, &str)> =
            vec![("a", "11"), ("b", "2"), ("d", "4"), ("e", "5"), ("f", "6")];
        let mut changes = Vec::new();
        for i in 0..3 {
            changes.extend(
                v.apply(watcher::Event::Apply(shard(1, i, 3, &after)))
                    .changes,
            );
        }
        let mut got: Vec<String> = changes
            .iter()
            .map(|m| match m {
                Membership::Upsert(r) => format!("+{}/{}", r.name, r.uid),
                Membership::Remove(r) => format!("-{}/{}", r.name, r.uid),
                Membership::Reset(_) => "reset".into(),
            })
            .collect();
        got.sort();
        assert_eq!(got, vec!["+a/11", "+f/6", "-c/3"]);
    }

    #[test]
    fn a_relist_of_the_same_complete_view_reports_only_the_difference() {
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        list(&mut v, (0..3).map(|i| shard(1, i, 3, NODES)).collect());
        let fewer: Vec<(&str, &str)> = NODES.iter().filter(|(n, _)| *n != "c").copied().collect();
        let c = list(&mut v, (0..3).map(|i| shard(1, i, 3, &fewer)).collect());
        assert_eq!(c, vec![Membership::Remove(rec("c", "3"))]);
        // An unchanged relist reports nothing.
        assert!(list(&mut v, (0..3).map(|i| shard(1, i, 3, &fewer)).collect()).is_empty());
    }

    #[test]
    fn a_missing_shard_means_no_change_at_all() {
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        assert!(list(&mut v, vec![shard(1, 0, 3, NODES), shard(1, 2, 3, NODES)]).is_empty());
        assert!(!v.is_complete());
        let c = v
            .apply(watcher::Event::Apply(shard(1, 1, 3, NODES)))
            .changes;
        assert_eq!(reset_names(&c).len(), 5, "complete again: the whole set");
        // A shard deleted: incomplete, and its nodes are NOT reported gone.
        let gone = v.apply(watcher::Event::Delete(shard(1, 1, 3, NODES)));
        assert!(gone.changes.is_empty());
        assert!(!v.is_complete());
    }

    #[test]
    fn a_new_epoch_is_incomplete_until_every_shard_is_rewritten() {
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        list(&mut v, (0..2).map(|i| shard(1, i, 2, NODES)).collect());
        // Reshard 2 -> 3 under epoch 2, shard by shard; shards of the old
        // epoch hold other nodes' records and must not count.
        let fewer: Vec<(&str, &str)> = NODES[..2].to_vec();
        assert!(
            v.apply(watcher::Event::Apply(shard(2, 0, 3, &fewer)))
                .changes
                .is_empty()
        );
        assert!(
            v.apply(watcher::Event::Apply(shard(2, 1, 3, &fewer)))
                .changes
                .is_empty()
        );
        assert!(!v.is_complete());
        let c = v
            .apply(watcher::Event::Apply(shard(2, 2, 3, &fewer)))
            .changes;
        assert_eq!(
            reset_names(&c),
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
    }

    #[test]
    fn a_corrupt_shard_is_rejected_and_makes_the_view_incomplete() {
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        list(&mut v, (0..2).map(|i| shard(1, i, 2, NODES)).collect());
        let bad = config_map(
            "nodegate",
            shard::DEFAULT_NAME,
            1,
            "{\"version\":1,\"nod".into(),
        );
        let step = v.apply(watcher::Event::Apply(bad));
        assert!(step.changes.is_empty(), "no prune from garbage");
        assert_eq!(step.rejected.len(), 1);
        assert_eq!(step.rejected[0].0, "nodegate-roster-1");
        assert!(!v.is_complete());
    }

    /// The forged shard of the roster-poisoning attack: a u64::MAX epoch
    /// claiming a one-shard, empty roster. Refused, so the view is
    /// incomplete and reports nothing (it used to be a complete, empty view:
    /// every node deleted).
    #[test]
    fn a_forged_epoch_is_rejected_not_an_empty_roster() {
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        list(&mut v, (0..2).map(|i| shard(1, i, 2, NODES)).collect());
        let forged = config_map(
            "nodegate",
            shard::DEFAULT_NAME,
            0,
            r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#.into(),
        );
        let step = v.apply(watcher::Event::Apply(forged.clone()));
        assert!(step.changes.is_empty(), "{:?}", step.changes);
        assert_eq!(step.rejected.len(), 1);
        assert!(!v.is_complete());
        // Also when it comes in a relist.
        let c = list(&mut v, vec![forged, shard(1, 1, 2, NODES)]);
        assert!(c.is_empty() && !v.is_complete());
        // The publisher rewrites the shard: complete again, nothing removed.
        let c = v
            .apply(watcher::Event::Apply(shard(1, 0, 2, NODES)))
            .changes;
        assert_eq!(reset_names(&c).len(), 5);
    }

    #[test]
    fn shards_disagreeing_on_the_count_are_incomplete() {
        let mut v = RosterView::new(shard::DEFAULT_NAME);
        let c = list(&mut v, vec![shard(1, 0, 2, NODES), shard(1, 1, 3, NODES)]);
        assert!(c.is_empty());
        assert!(!v.is_complete());
    }
}
