//! The publisher: watches Nodes (slim), keeps one record per node, and
//! while it leads writes the shards whose stored text differs from what the
//! records say. A heartbeat changes no record, so it writes nothing.
//!
//! Safety: nothing is written before the first complete list of Nodes (a
//! partial view would read as deletions) and before the existing shards are
//! known (their epoch decides whether this is a rebuild); every update
//! carries the resourceVersion read, so a stale writer gets a conflict.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::metrics::Metrics;
use nodegate_shared::NodeResource;

use crate::record::NodeRecord;
use crate::shard;
use crate::view::{Membership, NodeEvents};

/// The records, by shard, and the shard texts they encode to.
#[derive(Debug)]
pub struct Roster {
    count: u32,
    shards: Vec<BTreeMap<String, NodeRecord>>,
    listed: bool,
    /// Shards whose records changed since their text was last computed.
    dirty: BTreeSet<u32>,
    texts: Vec<Option<String>>,
    epoch: u64,
}

impl Roster {
    pub fn new(count: u32) -> Self {
        let count = count.max(1);
        Self {
            count,
            shards: vec![BTreeMap::new(); count as usize],
            listed: false,
            dirty: (0..count).collect(),
            texts: vec![None; count as usize],
            epoch: 0,
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// True once the first full list of Nodes is in.
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Sets the epoch to write under (all texts change).
    pub fn set_epoch(&mut self, epoch: u64) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.dirty.extend(0..self.count);
        }
    }

    fn upsert(&mut self, r: NodeRecord) {
        let i = shard::shard_of(&r.name, self.count);
        let s = &mut self.shards[i as usize];
        if s.get(&r.name) != Some(&r) {
            if let Some(old) = s.get(&r.name) {
                tracing::debug!(node = %r.name, ?old, new = ?r, "record changed");
            }
            s.insert(r.name.clone(), r);
            self.dirty.insert(i);
        }
    }

    fn remove(&mut self, name: &str, uid: &str) {
        let i = shard::shard_of(name, self.count);
        let s = &mut self.shards[i as usize];
        // A delete of an older incarnation leaves the new one alone.
        if s.get(name).is_some_and(|r| r.uid == uid) {
            s.remove(name);
            self.dirty.insert(i);
        }
    }

    /// Applies one membership change of the Node watch (through
    /// [`NodeEvents`], as the agent's Node-watch source does).
    pub fn apply(&mut self, change: Membership) {
        match change {
            Membership::Reset(listed) => {
                let gone: Vec<(String, String)> = self
                    .shards
                    .iter()
                    .flat_map(|s| s.values())
                    .filter(|r| listed.get(&r.name).map(|l| &l.uid) != Some(&r.uid))
                    .map(|r| (r.name.clone(), r.uid.clone()))
                    .collect();
                for (n, u) in gone {
                    self.remove(&n, &u);
                }
                for r in listed.into_values() {
                    self.upsert(r.for_roster());
                }
                self.listed = true;
            }
            Membership::Upsert(r) => self.upsert(r.for_roster()),
            Membership::Remove(r) => self.remove(&r.name, &r.uid),
        }
    }

    /// The text shard `i` must hold.
    pub fn text(&mut self, i: u32) -> &str {
        if self.dirty.remove(&i) || self.texts[i as usize].is_none() {
            self.texts[i as usize] = Some(shard::encode(
                self.epoch,
                i,
                self.count,
                self.shards[i as usize].values(),
            ));
        }
        self.texts[i as usize].as_deref().unwrap_or_default()
    }
}

/// The epoch to write under, from the shards found, at Unix time `now`:
/// keep the newest epoch when it is complete with this shard count (a
/// restart or failover rewrites only what changed, and readers stay
/// complete throughout). Otherwise start a new one: a first install, a new
/// `--shards`, or an epoch that is not complete — a rebuild someone left
/// half done, whose missing shards this publisher did not write and cannot
/// vouch for. Adopting it would let readers see it complete as soon as the
/// others are rewritten, before a half-written shard is. Readers see a new
/// epoch as incomplete until every shard of it is written.
///
/// A new epoch is `now` (or one past the newest epoch found, if that is
/// later), so every epoch a publisher writes is at most
/// [`shard::PUBLISHER_EPOCH_AHEAD_SECS`] ahead of its clock. Shards of a
/// later epoch were not written by a publisher: they are ignored (and
/// overwritten), so a forged epoch cannot lock the publisher out.
pub fn choose_epoch(existing: &[shard::Shard], count: u32, now: u64) -> u64 {
    let limit = now.saturating_add(shard::PUBLISHER_EPOCH_AHEAD_SECS);
    let ours: Vec<&shard::Shard> = existing.iter().filter(|s| s.epoch < limit).collect();
    match shard::complete_epoch(ours.iter().copied()) {
        Some((e, c)) if c == count => e,
        _ => ours
            .iter()
            .map(|s| s.epoch.saturating_add(1))
            .max()
            .unwrap_or(1)
            .max(now),
    }
}

/// One stored shard ConfigMap as last observed.
#[derive(Debug, Clone)]
struct Stored {
    rv: String,
    text: Option<String>,
    decoded: Option<shard::Shard>,
}

/// The shard ConfigMaps as the publisher's watch sees them.
#[derive(Debug, Default)]
struct Observed {
    by_name: HashMap<String, Stored>,
    listing: Option<HashMap<String, Stored>>,
    listed: bool,
}

impl Observed {
    fn stored(roster: &str, cm: &ConfigMap) -> Stored {
        Stored {
            rv: cm.resource_version().unwrap_or_default(),
            text: shard::text_of(cm).map(str::to_string),
            decoded: shard::decode(roster, cm).ok(),
        }
    }

    fn apply(&mut self, roster: &str, event: watcher::Event<ConfigMap>) {
        match event {
            watcher::Event::Init => self.listing = Some(HashMap::new()),
            watcher::Event::InitApply(cm) => {
                self.listing
                    .get_or_insert_with(HashMap::new)
                    .insert(cm.name_any(), Self::stored(roster, &cm));
            }
            watcher::Event::InitDone => {
                self.by_name = self.listing.take().unwrap_or_default();
                self.listed = true;
            }
            watcher::Event::Apply(cm) => {
                self.by_name
                    .insert(cm.name_any(), Self::stored(roster, &cm));
            }
            watcher::Event::Delete(cm) => {
                self.by_name.remove(&cm.name_any());
            }
        }
    }
}

/// Everything the publish loop needs.
pub struct Publisher {
    pub nodes: Api<NodeResource>,
    pub shards: Api<ConfigMap>,
    pub namespace: String,
    /// The roster's name: shard prefix and label value.
    pub name: String,
    pub count: u32,
    /// At most one round of writes per interval, however many events.
    pub interval: Duration,
    pub metrics: Metrics,
    /// Set once this replica has listed Nodes and shards (`/readyz`).
    pub ready: Arc<AtomicBool>,
}

impl Publisher {
    /// Watches Nodes and shards until `shutdown` flips, writing while
    /// `leader` is true.
    pub async fn run(self, mut leader: watch::Receiver<bool>, mut shutdown: watch::Receiver<bool>) {
        let nodes = watcher(self.nodes.clone(), watcher::Config::default()).default_backoff();
        let cms = watcher(
            self.shards.clone(),
            watcher::Config::default().labels(&shard::selector(&self.name)),
        )
        .default_backoff();
        let mut nodes = std::pin::pin!(nodes);
        let mut cms = std::pin::pin!(cms);
        let mut roster = Roster::new(self.count);
        let mut node_events = NodeEvents::default();
        let mut observed = Observed::default();
        // The epoch is chosen once per term, from the shards seen when it began.
        let mut epoch_chosen = false;
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut dirty = true;
        loop {
            tokio::select! {
                ev = nodes.next() => match ev {
                    Some(Ok(ev)) => {
                        if matches!(ev, watcher::Event::Apply(_) | watcher::Event::Delete(_)) {
                            self.metrics.node_events.inc();
                        }
                        if let Some(change) = node_events.apply(ev) {
                            roster.apply(change);
                        }
                        self.metrics.nodes.set(roster.len() as i64);
                        dirty = true;
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "node watch failed, retrying"),
                    None => break,
                },
                ev = cms.next() => match ev {
                    Some(Ok(ev)) => {
                        observed.apply(&self.name, ev);
                        dirty = true;
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "roster watch failed, retrying"),
                    None => break,
                },
                _ = leader.changed() => {
                    let lead = *leader.borrow_and_update();
                    self.metrics.leader.set(i64::from(lead));
                    epoch_chosen = false;
                    dirty = true;
                }
                _ = tick.tick() => {
                    if roster.is_listed() && observed.listed && !self.ready.swap(true, Ordering::SeqCst) {
                        tracing::info!(nodes = roster.len(), shards = roster.count(), "nodes and shards listed");
                    }
                    if dirty && *leader.borrow() && roster.is_listed() && observed.listed {
                        if !epoch_chosen {
                            let found: Vec<shard::Shard> = observed.by_name.values().filter_map(|s| s.decoded.clone()).collect();
                            let epoch = choose_epoch(&found, roster.count(), shard::unix_now());
                            tracing::info!(epoch, shards = roster.count(), existing = found.len(), "leading: publishing the roster");
                            roster.set_epoch(epoch);
                            epoch_chosen = true;
                        }
                        dirty = !self.publish(&mut roster, &mut observed, &leader).await;
                    }
                }
                _ = nodegate_shared::signal::stopped(&mut shutdown) => break,
            }
        }
    }

    /// Writes every shard whose stored text differs; then removes shards
    /// the current epoch does not use. Returns true when all was in sync.
    async fn publish(
        &self,
        roster: &mut Roster,
        observed: &mut Observed,
        leader: &watch::Receiver<bool>,
    ) -> bool {
        let mut in_sync = true;
        let mut max_bytes = 0usize;
        for i in 0..roster.count() {
            let name = shard::name_of(&self.name, i);
            let text = roster.text(i).to_string();
            max_bytes = max_bytes.max(text.len());
            let stored = observed.by_name.get(&name);
            if stored.and_then(|s| s.text.as_deref()) == Some(text.as_str()) {
                continue;
            }
            in_sync = false;
            // Fencing: stop at once when the lease is lost mid-round.
            if !*leader.borrow() {
                return false;
            }
            if text.len() > shard::WARN_BYTES {
                tracing::warn!(shard = %name, bytes = text.len(), "roster shard above 256 KiB: raise --shards");
            }
            let mut cm = shard::config_map(&self.namespace, &self.name, i, text);
            let res = match stored {
                Some(s) => {
                    cm.metadata.resource_version = Some(s.rv.clone());
                    self.shards
                        .replace(&name, &PostParams::default(), &cm)
                        .await
                }
                None => self.shards.create(&PostParams::default(), &cm).await,
            };
            // What we wrote is what is stored now, before the watch says so:
            // the next round must not rewrite it from the older version.
            if let Ok(written) = &res {
                observed
                    .by_name
                    .insert(name.clone(), Observed::stored(&self.name, written));
            }
            self.record(&name, res.map(|_| ()));
        }
        self.metrics.shard_bytes_max.set(max_bytes as i64);
        if !in_sync {
            // The watch brings our writes back; stale shards go after that.
            return false;
        }
        let stale: Vec<(String, String)> = observed
            .by_name
            .iter()
            .map(|(n, s)| (n.clone(), s.rv.clone()))
            .collect();
        for (name, rv) in stale {
            let current = shard::index_of(&self.name, &name).is_some_and(|i| i < roster.count());
            if current || !*leader.borrow() {
                continue;
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(rv),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            let res = self.shards.delete(&name, &dp).await;
            if res.is_ok() {
                observed.by_name.remove(&name);
            }
            self.record(&name, res.map(|_| ()));
        }
        true
    }

    fn record(&self, name: &str, res: Result<(), kube::Error>) {
        match res {
            Ok(()) => {
                self.metrics
                    .writes
                    .get_or_create(&crate::metrics::result("ok"))
                    .inc();
                tracing::debug!(shard = %name, "shard written");
            }
            // Someone wrote first: the watch brings the newer version and the
            // next round compares against it.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.metrics
                    .writes
                    .get_or_create(&crate::metrics::result("conflict"))
                    .inc();
                tracing::debug!(shard = %name, "shard changed meanwhile; retrying");
            }
            Err(e) => {
                self.metrics
                    .writes
                    .get_or_create(&crate::metrics::result("error"))
                    .inc();
                tracing::warn!(shard = %name, error = %e, "cannot write roster shard");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, uid: &str, ip: &str) -> NodeResource {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid, "labels": {"l": ip}},
            "spec": {"podCIDR": "198.18.0.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                       "nodeInfo": {"bootID": ip}},
        }))
        .unwrap()
    }

    /// A roster fed Node watch events as the publish loop feeds it.
    struct Fed {
        r: Roster,
        n: NodeEvents,
    }

    impl Fed {
        fn apply(&mut self, ev: watcher::Event<NodeResource>) {
            if let Some(m) = self.n.apply(ev) {
                self.r.apply(m);
            }
        }
    }

    fn listed(nodes: &[(&str, &str)]) -> Fed {
        let mut r = Fed {
            r: Roster::new(4),
            n: NodeEvents::default(),
        };
        r.r.set_epoch(1);
        r.apply(watcher::Event::Init);
        for (n, u) in nodes {
            r.apply(watcher::Event::InitApply(node(n, u, "198.19.0.1")));
        }
        assert!(!r.r.is_listed());
        r.apply(watcher::Event::InitDone);
        assert!(r.r.is_listed());
        r
    }

    fn texts(r: &mut Roster) -> Vec<String> {
        (0..r.count()).map(|i| r.text(i).to_string()).collect()
    }

    #[test]
    fn heartbeats_labels_and_reboots_change_no_shard() {
        let mut r = listed(&[("a", "1"), ("b", "2")]);
        let before = texts(&mut r.r);
        // Same uid, addresses, CIDRs: only labels and the boot ID differ.
        let mut n = node("a", "1", "198.19.0.1");
        n.view.metadata.labels = [("new".to_string(), "label".to_string())].into();
        r.apply(watcher::Event::Apply(n));
        assert!(r.r.dirty.is_empty(), "no shard to rewrite");
        assert_eq!(texts(&mut r.r), before);
        // An address change does rewrite exactly one shard.
        r.apply(watcher::Event::Apply(node("a", "1", "198.19.0.9")));
        assert_eq!(r.r.dirty.len(), 1);
        let after = texts(&mut r.r);
        assert_eq!(before.iter().zip(&after).filter(|(x, y)| x != y).count(), 1);
    }

    #[test]
    fn deletes_are_uid_aware_and_relists_drop_missed_nodes() {
        let mut r = listed(&[("a", "1"), ("b", "2"), ("c", "3")]);
        // A delete of an older incarnation leaves the new one.
        r.apply(watcher::Event::Apply(node("a", "11", "198.19.0.1")));
        r.apply(watcher::Event::Delete(node("a", "1", "198.19.0.1")));
        assert_eq!(r.r.len(), 3);
        r.apply(watcher::Event::Delete(node("a", "11", "198.19.0.1")));
        assert_eq!(r.r.len(), 2);
        // A relist without "b" (deleted during a watch gap) drops it.
        r.apply(watcher::Event::Init);
        r.apply(watcher::Event::InitApply(node("c", "3", "198.19.0.1")));
        assert_eq!(r.r.len(), 2, "nothing changes before the relist is done");
        r.apply(watcher::Event::InitDone);
        assert_eq!(r.r.len(), 1);
        let all: String = texts(&mut r.r).concat();
        assert!(all.contains("\"c\"") && !all.contains("\"b\""), "{all}");
        assert!(!all.contains("labels") && !all.contains("bootID"), "{all}");
    }

    const NOW: u64 = 1_800_000_000;

    fn s(epoch: u64, index: u32, count: u32) -> shard::Shard {
        shard::Shard {
            epoch,
            index,
            count,
            nodes: Default::default(),
        }
    }

    fn all(epoch: u64, count: u32) -> Vec<shard::Shard> {
        (0..count).map(|i| s(epoch, i, count)).collect()
    }

    #[test]
    fn epoch_kept_on_failover_new_on_first_install_or_reshard() {
        assert_eq!(choose_epoch(&[], 4, NOW), NOW);
        // Failover: a complete epoch with this count is kept, old counters too.
        assert_eq!(choose_epoch(&all(3, 4), 4, NOW), 3);
        assert_eq!(choose_epoch(&all(NOW - 50, 4), 4, NOW), NOW - 50);
        // A new shard count.
        assert_eq!(choose_epoch(&all(3, 2), 4, NOW), NOW);
        // A rebuild left half done (epoch 4 has 1 of 4 shards): not adopted,
        // since completing it would make its unwritten shards look trusted.
        let mut half = all(3, 4);
        half[2] = s(4, 2, 4);
        assert_eq!(choose_epoch(&half, 4, NOW), NOW);
        // A clock behind the last epoch: still a newer one.
        let mut half = all(NOW + 10, 4);
        half[2] = s(NOW + 20, 2, 4);
        assert_eq!(choose_epoch(&half, 4, NOW), NOW + 21);
    }

    /// A forged epoch (u64::MAX, or anywhere a publisher never writes) used
    /// to lock the publisher out (`max + 1` overflowed); now it is ignored.
    #[test]
    fn a_forged_future_epoch_does_not_lock_the_publisher_out() {
        let limit = NOW + shard::PUBLISHER_EPOCH_AHEAD_SECS;
        for forged in [u64::MAX, u64::MAX - 1, limit, NOW + 100_000] {
            // A forged shard next to a complete epoch: the epoch is kept.
            let mut found = all(NOW - 5, 4);
            found.push(s(forged, 4, 5));
            assert_eq!(choose_epoch(&found, 4, NOW), NOW - 5, "{forged}");
            // A complete forged epoch: a new epoch of our own.
            assert_eq!(choose_epoch(&all(forged, 4), 4, NOW), NOW, "{forged}");
        }
        // Shortly ahead (a skewed clock of another replica) is still ours.
        assert_eq!(choose_epoch(&all(limit - 1, 4), 4, NOW), limit - 1);
    }
}
