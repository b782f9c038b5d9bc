//! Deletion confirmation: whatever the node set's source says (a roster
//! shard anyone with ConfigMap write access in the namespace can forge), a
//! deletion handler runs only for a record no live Node shares anything
//! with. Each deletion is confirmed by one GET of the node by name: 404
//! means the name is free; the same uid means live (never handled); another
//! uid means the name belongs to a live node now (held, see below); any
//! other error means ask again later.
//!
//! A 404 says nothing about the record's addresses, podCIDRs or providerID,
//! and a roster record may carry anyone's. So before a confirmed deletion
//! goes to the handlers its record is checked against everything the agent
//! knows to be live ([`Holders`]: its live set, its own node, the claims a
//! live node dropped since it was seen with them, the deletions not yet
//! confirmed): an IP or podCIDR that overlaps one of theirs, a DNS address
//! or name equal to one of their names or DNS addresses, or the same
//! providerID, is a [`Conflict`], and the record is held, never handled
//! while the conflict lasts ([`crate::prune`]). No request is added: the
//! check reads only what the agent already holds.
//!
//! Cost, bounded at any cluster size: every agent confirms every deletion,
//! so an agent spends at most `qps / known nodes` GETs per second (a token
//! bucket of [`BURST`]) and starts each confirmation at a random point of
//! `known / qps` seconds. With one agent per node the API server sees about
//! `qps` confirmation GETs per second in all, however many nodes there are.
//!
//! A mass deletion (more than `hold_count` nodes in one change, or more than
//! `hold_share` of the known nodes when at least [`HOLD_SHARE_MIN`] go) is
//! held: counted, and confirmed one node at a time in random order. The
//! first node the API server still has refuses the rest of the batch, so a
//! forged empty roster costs each agent about one GET instead of one per
//! node, and nothing runs.
//!
//! Pure: deletions and GET results in, GETs to make and verdicts out; the
//! caller passes the time, randomness is a seeded generator.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use nodegate_roster::record::NodeRecord;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::deletion::{DeleteSource, Deletion, key};

/// Confirmation GETs an agent may make back to back before the pace applies.
pub const BURST: f64 = 5.0;
/// The share rule counts only from this many deletions in one change: in a
/// small cluster a few nodes are a large share.
pub const HOLD_SHARE_MIN: usize = 5;
/// Longest pause between two confirmations of one node after errors.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Longest spread of a confirmation's start, whatever the cluster size.
const MAX_WINDOW: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfirmConfig {
    /// Confirmation GETs per second for the whole cluster (all agents).
    pub qps: f64,
    /// A change deleting more nodes than this is held.
    pub hold_count: usize,
    /// A change deleting more than this share of the known nodes is held.
    pub hold_share: f64,
}

/// What the API server said about a node name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// 404.
    Missing,
    /// Found, with this uid.
    Uid(String),
    /// Any other answer, or none.
    Failed(String),
}

/// The verdict on one finished confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The API server has no node under the record's name: the handlers may
    /// run once the record passes [`Holders::conflict`].
    Gone(Deletion),
    /// The API server has a node under the record's name with another uid
    /// (`holder`): this incarnation is gone, but its name is a live node's
    /// (a node re-created under its name, or a record with a forged uid).
    /// Never handled while the name is held.
    NameHeld { deletion: Deletion, holder: String },
    /// The API server has the node with that uid: never handled. In a held
    /// batch, the batch's unconfirmed rest comes along (refused unasked).
    Live(Vec<NodeRecord>),
    /// Asked again later.
    Retry,
    /// Nothing was pending under that uid.
    Unknown,
}

#[derive(Debug, Clone)]
struct Pending {
    record: NodeRecord,
    source: DeleteSource,
    /// Held batch it belongs to.
    batch: Option<u64>,
    due: Instant,
    attempts: u32,
}

#[derive(Debug)]
pub struct Confirmer {
    cfg: ConfirmConfig,
    rng: StdRng,
    /// By [`key`] (name and uid).
    pending: HashMap<String, Pending>,
    in_flight: Option<String>,
    tokens: f64,
    refilled: Instant,
    known: usize,
    next_batch: u64,
}

impl Confirmer {
    pub fn new(cfg: ConfirmConfig, seed: u64, now: Instant) -> Self {
        Self {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            pending: HashMap::new(),
            in_flight: None,
            tokens: BURST,
            refilled: now,
            known: 1,
            next_batch: 0,
        }
    }

    /// Nodes known (the pace depends on the cluster's size).
    pub fn set_known(&mut self, known: usize) {
        self.known = known.max(1);
    }

    /// This agent's share of the cluster's budget, GETs per second.
    fn rate(&self) -> f64 {
        (self.cfg.qps / self.known as f64).max(f64::MIN_POSITIVE)
    }

    /// Over how long the agents' confirmations of one deletion spread.
    pub fn window(&self) -> Duration {
        Duration::try_from_secs_f64(1.0 / self.rate())
            .unwrap_or(MAX_WINDOW)
            .min(MAX_WINDOW)
    }

    /// True when `n` deletions in one change out of `known` nodes are a
    /// mass deletion.
    pub fn is_mass(&self, n: usize, known: usize) -> bool {
        n > self.cfg.hold_count
            || (n >= HOLD_SHARE_MIN && n as f64 > self.cfg.hold_share * known as f64)
    }

    /// Takes the deletions of one change, when `known` nodes were known
    /// before it. Returns true when they were held as a mass deletion.
    pub fn submit(&mut self, deletions: Vec<Deletion>, known: usize, now: Instant) -> bool {
        let fresh: Vec<Deletion> = deletions
            .into_iter()
            .filter(|(r, _)| !self.pending.contains_key(&key(r)))
            .collect();
        if fresh.is_empty() {
            return false;
        }
        let held = self.is_mass(fresh.len(), known);
        let batch = held.then(|| {
            self.next_batch += 1;
            self.next_batch
        });
        let window = self.window();
        for (record, source) in fresh {
            // A random start within the window: agents do not all ask at
            // once, and a held batch is confirmed in random order.
            let due = now + window.mul_f64(self.rng.random::<f64>());
            self.pending.insert(
                key(&record),
                Pending {
                    record,
                    source,
                    batch,
                    due,
                    attempts: 0,
                },
            );
        }
        held
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate()).min(BURST);
        self.refilled = now;
    }

    /// When [`Confirmer::start`] has something to do next; `None` while a
    /// GET is in flight or nothing is pending.
    pub fn next_due(&self) -> Option<Instant> {
        if self.in_flight.is_some() {
            return None;
        }
        let due = self.pending.values().map(|p| p.due).min()?;
        let missing = (1.0 - self.tokens).max(0.0);
        let token_at = self.refilled
            + Duration::try_from_secs_f64(missing / self.rate()).unwrap_or(MAX_WINDOW);
        Some(due.max(token_at))
    }

    /// The node to GET now, if one is due and the pace allows.
    pub fn start(&mut self, now: Instant) -> Option<NodeRecord> {
        if self.in_flight.is_some() {
            return None;
        }
        self.refill(now);
        // Tolerates the rounding of `next_due`'s float arithmetic.
        if self.tokens < 1.0 - 1e-6 {
            return None;
        }
        let k = self
            .pending
            .iter()
            .filter(|(_, p)| p.due <= now)
            .min_by_key(|(_, p)| p.due)
            .map(|(k, _)| k.clone())?;
        self.tokens = (self.tokens - 1.0).max(0.0);
        self.in_flight = Some(k.clone());
        self.pending.get(&k).map(|p| p.record.clone())
    }

    /// The answer to the GET of the node of deletion `k` ([`key`]).
    pub fn finish(&mut self, k: &str, lookup: Lookup, now: Instant) -> Outcome {
        if self.in_flight.as_deref() == Some(k) {
            self.in_flight = None;
        }
        let Some(mut p) = self.pending.remove(k) else {
            return Outcome::Unknown;
        };
        match lookup {
            Lookup::Missing => Outcome::Gone((p.record, p.source)),
            Lookup::Uid(u) if !u.is_empty() && u != p.record.uid => Outcome::NameHeld {
                deletion: (p.record, p.source),
                holder: u,
            },
            Lookup::Uid(u) if u == p.record.uid => {
                let mut live = vec![p.record];
                if let Some(b) = p.batch {
                    let rest: Vec<String> = self
                        .pending
                        .iter()
                        .filter(|(_, q)| q.batch == Some(b))
                        .map(|(u, _)| u.clone())
                        .collect();
                    live.extend(
                        rest.iter()
                            .filter_map(|u| self.pending.remove(u))
                            .map(|q| q.record),
                    );
                }
                Outcome::Live(live)
            }
            // An empty uid is no answer either.
            Lookup::Uid(_) | Lookup::Failed(_) => {
                p.attempts += 1;
                let backoff = Duration::from_secs(1u64 << p.attempts.min(9)).min(MAX_BACKOFF);
                p.due = now + backoff.mul_f64(0.5 + self.rng.random::<f64>());
                self.pending.insert(k.to_string(), p);
                Outcome::Retry
            }
        }
    }

    /// Takes deletions again that were confirmed once and held for a
    /// conflict that has cleared: asked again (a GET, at the pace), never as
    /// a mass deletion.
    pub fn requeue(&mut self, deletions: Vec<Deletion>, now: Instant) {
        let window = self.window();
        for (record, source) in deletions {
            if self.pending.contains_key(&key(&record)) {
                continue;
            }
            let due = now + window.mul_f64(self.rng.random::<f64>());
            self.pending.insert(
                key(&record),
                Pending {
                    record,
                    source,
                    batch: None,
                    due,
                    attempts: 0,
                },
            );
        }
    }

    /// Deletions waiting for a confirmation.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Their records: nodes the API server may still have, so what they
    /// hold counts as held ([`Holders`]).
    pub fn pending_records(&self) -> impl Iterator<Item = &NodeRecord> {
        self.pending.values().map(|p| &p.record)
    }

    /// Of those, the ones in held mass deletions.
    pub fn held(&self) -> usize {
        self.pending.values().filter(|p| p.batch.is_some()).count()
    }
}

/// The part of a record a conflict is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    Name,
    Address,
    PodCidr,
    ProviderId,
}

impl Field {
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Name => "name",
            Field::Address => "address",
            Field::PodCidr => "podCIDR",
            Field::ProviderId => "providerID",
        }
    }

    /// The `result` label of `nodegate_agent_prune_confirmations_total` for
    /// a deletion held for this field.
    pub fn result(self) -> &'static str {
        match self {
            Field::Name => "conflict_name",
            Field::Address => "conflict_address",
            Field::PodCidr => "conflict_pod_cidr",
            Field::ProviderId => "conflict_provider_id",
        }
    }

    pub const ALL: [Field; 4] = [
        Field::Name,
        Field::Address,
        Field::PodCidr,
        Field::ProviderId,
    ];
}

/// A value of a deletion's record that a live node holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub field: Field,
    /// The record's value (as the record has it).
    pub value: String,
    /// The live node holding it: its name (empty when only the API server
    /// named it, by uid) and uid.
    pub holder: String,
    pub holder_uid: String,
}

impl Conflict {
    /// The API server has the record's name under another uid.
    pub fn name_held(record: &NodeRecord, holder_uid: &str) -> Self {
        Self {
            field: Field::Name,
            value: record.name.clone(),
            holder: record.name.clone(),
            holder_uid: holder_uid.to_string(),
        }
    }
}

/// An IP prefix in one space: IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`,
/// prefix + 96), so `10.0.0.1`, `::ffff:10.0.0.1` and `10.0.0.0/24` compare
/// as what they address, not as text. A single IP is a /128.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Net {
    /// The network (host bits cleared).
    base: u128,
    len: u8,
}

fn mask(len: u8) -> u128 {
    match len {
        0 => 0,
        l => u128::MAX << (128 - u32::from(l.min(128))),
    }
}

impl Net {
    fn new(ip: IpAddr, len: u8) -> Self {
        let (bits, len) = match ip {
            IpAddr::V4(a) => (u128::from(a.to_ipv6_mapped()), len.saturating_add(96)),
            IpAddr::V6(a) => (u128::from(a), len),
        };
        let len = len.min(128);
        Self {
            base: bits & mask(len),
            len,
        }
    }

    fn ip(s: &str) -> Option<Self> {
        let ip: IpAddr = s.parse().ok()?;
        Some(Self::new(ip, if ip.is_ipv4() { 32 } else { 128 }))
    }

    /// A CIDR (`ip/len`), host bits allowed; a bare IP is its own /32 or /128.
    fn cidr(s: &str) -> Option<Self> {
        let Some((ip, len)) = s.split_once('/') else {
            return Self::ip(s);
        };
        let ip: IpAddr = ip.parse().ok()?;
        let len: u8 = len.parse().ok()?;
        if len > if ip.is_ipv4() { 32 } else { 128 } {
            return None;
        }
        Some(Self::new(ip, len))
    }

    /// The last address of the prefix.
    fn end(self) -> u128 {
        self.base | !mask(self.len)
    }
}

/// Everything the agent knows to be live, indexed for [`Holders::conflict`]:
/// names and DNS addresses (lower case), providerIDs, and every IP and
/// podCIDR as a prefix. Built from the records in O(n).
#[derive(Debug, Default)]
pub struct Holders<'a> {
    who: Vec<&'a NodeRecord>,
    /// Names, DNS addresses and any value that does not parse as an IP or
    /// CIDR (compared as text), lower case.
    words: HashMap<String, Vec<usize>>,
    providers: HashMap<&'a str, Vec<usize>>,
    /// Prefixes by network: `(len, holder)`.
    nets: BTreeMap<u128, Vec<(u8, usize)>>,
    lens: BTreeSet<u8>,
}

impl<'a> Holders<'a> {
    pub fn new(records: impl IntoIterator<Item = &'a NodeRecord>) -> Self {
        let mut h = Self::default();
        for r in records {
            let i = h.who.len();
            h.who.push(r);
            h.word(&r.name, i);
            if let Some(p) = r.provider_id.as_deref().filter(|p| !p.is_empty()) {
                h.providers.entry(p).or_default().push(i);
            }
            for a in &r.addresses {
                match Net::ip(&a.address) {
                    Some(n) => h.net(n, i),
                    None => h.word(&a.address, i),
                }
            }
            for c in &r.pod_cidrs {
                match Net::cidr(c) {
                    Some(n) => h.net(n, i),
                    None => h.word(c, i),
                }
            }
        }
        h
    }

    fn word(&mut self, w: &str, i: usize) {
        if !w.is_empty() {
            self.words
                .entry(w.to_ascii_lowercase())
                .or_default()
                .push(i);
        }
    }

    fn net(&mut self, n: Net, i: usize) {
        self.nets.entry(n.base).or_default().push((n.len, i));
        self.lens.insert(n.len);
    }

    /// The first holder among `idx` that is not `r` itself (the same name
    /// and uid: a record carrying another node's uid is not that node).
    fn other(
        &self,
        idx: impl IntoIterator<Item = usize>,
        r: &NodeRecord,
    ) -> Option<&'a NodeRecord> {
        idx.into_iter()
            .map(|i| self.who[i])
            .find(|h| h.uid != r.uid || h.name != r.name)
    }

    fn by_word(&self, w: &str, r: &NodeRecord) -> Option<&'a NodeRecord> {
        let idx = self.words.get(&w.to_ascii_lowercase())?;
        self.other(idx.iter().copied(), r)
    }

    /// A holder of a prefix overlapping `n`: one that contains it (a
    /// shorter or equal prefix on the way down) or one it contains (a
    /// network within its range).
    fn by_net(&self, n: Net, r: &NodeRecord) -> Option<&'a NodeRecord> {
        let containing = self
            .lens
            .iter()
            .filter(|&&l| l <= n.len)
            .filter_map(|&l| self.nets.get(&(n.base & mask(l))).map(|v| (l, v)))
            .flat_map(|(l, v)| v.iter().filter(move |(hl, _)| *hl == l).map(|(_, i)| *i));
        if let Some(h) = self.other(containing, r) {
            return Some(h);
        }
        let contained = self
            .nets
            .range(n.base..=n.end())
            .flat_map(|(_, v)| v.iter())
            .filter(|(hl, _)| *hl >= n.len)
            .map(|(_, i)| *i);
        self.other(contained, r)
    }

    /// What of `r` a holder other than `r` itself (another name or uid) also holds:
    /// its name, providerID, an address (IP: overlapping one of the
    /// holder's IPs or podCIDRs; DNS: equal to a holder's name or DNS
    /// address) or a podCIDR (overlapping one of the holder's IPs or
    /// podCIDRs). `None`: nothing live holds any of it.
    pub fn conflict(&self, r: &NodeRecord) -> Option<Conflict> {
        let found = |field: Field, value: &str, h: &NodeRecord| Conflict {
            field,
            value: value.to_string(),
            holder: h.name.clone(),
            holder_uid: h.uid.clone(),
        };
        if let Some(h) = self.by_word(&r.name, r) {
            return Some(found(Field::Name, &r.name, h));
        }
        if let Some(p) = r.provider_id.as_deref().filter(|p| !p.is_empty())
            && let Some(h) = self
                .providers
                .get(p)
                .and_then(|v| self.other(v.iter().copied(), r))
        {
            return Some(found(Field::ProviderId, p, h));
        }
        for a in &r.addresses {
            let h = match Net::ip(&a.address) {
                Some(n) => self.by_net(n, r),
                None => self.by_word(&a.address, r),
            };
            if let Some(h) = h {
                return Some(found(Field::Address, &a.address, h));
            }
        }
        for c in &r.pod_cidrs {
            let h = match Net::cidr(c) {
                Some(n) => self.by_net(n, r),
                None => self.by_word(c, r),
            };
            if let Some(h) = h {
                return Some(found(Field::PodCidr, c, h));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: ConfirmConfig = ConfirmConfig {
        qps: 200.0,
        hold_count: 50,
        hold_share: 0.2,
    };

    fn rec(i: usize) -> NodeRecord {
        NodeRecord {
            name: format!("n{i}"),
            uid: format!("u{i}"),
            addresses: vec![],
            pod_cidrs: vec![],
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        }
    }

    fn dels(range: std::ops::Range<usize>) -> Vec<Deletion> {
        range.map(|i| (rec(i), DeleteSource::Watch)).collect()
    }

    /// Runs the confirmer against an API server that has `live` (name →
    /// uid), answering every GET at once, until nothing is due within a day;
    /// returns the names found gone (404, or held by another uid: `name:uid`),
    /// the refused names and the GETs made.
    fn drive(
        c: &mut Confirmer,
        t0: Instant,
        mut answer: impl FnMut(&NodeRecord) -> Lookup,
    ) -> (Vec<String>, Vec<String>, usize, Duration) {
        let (mut gone, mut live, mut gets, mut last) = (Vec::new(), Vec::new(), 0, t0);
        while let Some(at) = c.next_due() {
            last = at;
            assert!(at < t0 + Duration::from_secs(86_400), "stuck");
            let r = c.start(at).expect("due means startable");
            gets += 1;
            match c.finish(&key(&r), answer(&r), at) {
                Outcome::Gone((r, _)) => gone.push(r.name),
                Outcome::NameHeld {
                    deletion: (r, _),
                    holder,
                } => gone.push(format!("{}:{holder}", r.name)),
                Outcome::Live(rs) => live.extend(rs.into_iter().map(|r| r.name)),
                Outcome::Retry => {}
                Outcome::Unknown => panic!("unknown uid"),
            }
        }
        gone.sort();
        live.sort();
        (gone, live, gets, last - t0)
    }

    #[test]
    fn hold_rule_table() {
        let c = Confirmer::new(CFG, 1, Instant::now());
        // (deleted in one change, known before, held)
        let table = [
            (1, 1, false),
            (3, 7, false), // 43 % of a tiny cluster, but under HOLD_SHARE_MIN
            (4, 4, false), // ditto
            (5, 5, true),  // everything, five nodes
            (5, 100, false),
            (20, 100, false),
            (21, 100, true), // > 20 %
            (50, 5000, false),
            (51, 5000, true), // > hold_count
            (5000, 5000, true),
        ];
        for (n, known, held) in table {
            assert_eq!(c.is_mass(n, known), held, "{n} of {known}");
        }
    }

    /// The forged empty roster: every known node reported deleted. Held,
    /// one GET finds a live node, the whole batch is refused unhandled.
    #[test]
    fn a_forged_empty_roster_costs_one_get_and_runs_nothing() {
        let t0 = Instant::now();
        for known in [10, 1000, 5000] {
            let mut c = Confirmer::new(CFG, known as u64, t0);
            c.set_known(known);
            assert!(c.submit(dels(0..known), known, t0), "held");
            assert_eq!((c.pending(), c.held()), (known, known));
            let (gone, live, gets, _) = drive(&mut c, t0, |r| Lookup::Uid(r.uid.clone()));
            assert!(gone.is_empty());
            assert_eq!(live.len(), known, "all refused");
            assert_eq!(gets, 1, "one GET per agent");
            assert_eq!(c.pending(), 0);
        }
    }

    /// A forged shard that drops a few nodes (not a mass deletion): each is
    /// confirmed and refused on its own; none runs.
    #[test]
    fn a_few_forged_deletions_are_each_refused() {
        let t0 = Instant::now();
        let mut c = Confirmer::new(CFG, 7, t0);
        c.set_known(100);
        assert!(!c.submit(dels(0..3), 100, t0));
        let (gone, live, gets, _) = drive(&mut c, t0, |r| Lookup::Uid(r.uid.clone()));
        assert_eq!(
            (gone.len(), live, gets),
            (0, vec!["n0".into(), "n1".into(), "n2".into()], 3)
        );
    }

    /// Truly deleted: gone. Re-created under the name (another uid): this
    /// incarnation is gone but the name is held by the new one. Errors are
    /// retried with backoff and never count as gone.
    #[test]
    fn gone_means_404_or_another_uid_and_errors_retry() {
        let t0 = Instant::now();
        let mut c = Confirmer::new(CFG, 3, t0);
        c.set_known(10);
        c.submit(dels(0..3), 10, t0);
        let mut failures = 0;
        let (gone, live, gets, _) = drive(&mut c, t0, |r| match r.name.as_str() {
            "n0" => Lookup::Missing,
            "n1" => Lookup::Uid("new".into()),
            // Two failures (and a uid-less answer), then 404.
            _ if failures < 3 => {
                failures += 1;
                if failures == 3 {
                    Lookup::Uid(String::new())
                } else {
                    Lookup::Failed("503".into())
                }
            }
            _ => Lookup::Missing,
        });
        assert_eq!(gone, vec!["n0", "n1:new", "n2"]);
        assert!(live.is_empty());
        assert_eq!(gets, 6);
    }

    /// A real mass deletion (scale-down) is held but still handled, each
    /// node exactly once, at the paced rate.
    #[test]
    fn a_real_mass_deletion_is_handled_once_at_the_pace() {
        let t0 = Instant::now();
        let mut c = Confirmer::new(CFG, 9, t0);
        c.set_known(1000);
        assert!(c.submit(dels(0..300), 1000, t0));
        // The same deletions again (a relist) are not queued twice.
        assert!(!c.submit(dels(0..300), 1000, t0));
        let mut last = t0;
        let (gone, live, gets, _) = drive(&mut c, t0, |_| Lookup::Missing);
        assert_eq!(gone.len(), 300);
        assert!(live.is_empty());
        assert_eq!(gets, 300, "one GET per deleted node");
        // Pace: qps / known = 0.2 GET/s; after the burst, ~5 s apart.
        while let Some(at) = c.next_due() {
            last = at;
        }
        assert_eq!(last, t0);
    }

    /// The pace bounds the GETs whatever arrives: 5,000 nodes, an agent
    /// fed 1,000 forged small changes (each refused) makes at most
    /// BURST + rate × elapsed GETs.
    #[test]
    fn the_pace_bounds_gets_at_5000_nodes() {
        let t0 = Instant::now();
        let mut c = Confirmer::new(CFG, 11, t0);
        c.set_known(5000);
        assert_eq!(c.window(), Duration::from_secs(25));
        for k in 0..1000 {
            c.submit(dels(k * 4..k * 4 + 4), 5000, t0);
        }
        let horizon = t0 + Duration::from_secs(600);
        let mut gets = 0;
        while let Some(at) = c.next_due() {
            if at > horizon {
                break;
            }
            let r = c.start(at).expect("due");
            gets += 1;
            assert!(matches!(
                c.finish(&key(&r), Lookup::Uid(r.uid.clone()), at),
                Outcome::Live(_)
            ));
        }
        // 600 s at 200/5000 GET/s, plus the burst.
        assert!(gets <= 5 + 24 + 1, "{gets} GETs in 10 minutes");
        assert!(gets >= 20, "still making progress: {gets}");
    }

    #[test]
    fn one_get_at_a_time_and_unknown_answers_are_ignored() {
        let t0 = Instant::now();
        let mut c = Confirmer::new(CFG, 5, t0);
        c.set_known(1);
        c.submit(dels(0..2), 1, t0);
        let at = c.next_due().unwrap();
        let r = c.start(at).unwrap();
        assert!(c.next_due().is_none() && c.start(at).is_none(), "in flight");
        assert_eq!(c.finish("nope", Lookup::Missing, at), Outcome::Unknown);
        assert!(matches!(
            c.finish(&key(&r), Lookup::Missing, at),
            Outcome::Gone(_)
        ));
        assert!(c.next_due().is_some());
    }

    fn node(name: &str, uid: &str, addrs: &[(&str, &str)], cidrs: &[&str]) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            uid: uid.into(),
            addresses: addrs
                .iter()
                .map(|(k, a)| nodegate_roster::record::NodeAddress {
                    kind: (*k).into(),
                    address: (*a).into(),
                })
                .collect(),
            pod_cidrs: cidrs.iter().map(|c| (*c).to_string()).collect(),
            provider_id: None,
            boot_id: None,
            labels: Default::default(),
        }
    }

    /// The live nodes of the conflict table.
    fn live_pair() -> [NodeRecord; 2] {
        [
            NodeRecord {
                provider_id: Some("aws:///i-1".into()),
                ..node(
                    "live-1",
                    "u1",
                    &[
                        ("InternalIP", "10.0.0.1"),
                        ("Hostname", "live-1"),
                        ("InternalIP", "fd00::1"),
                    ],
                    &["10.244.1.0/24", "fd00:244:1::/64"],
                )
            },
            node(
                "live-2",
                "u2",
                &[("InternalIP", "10.0.0.2"), ("ExternalIP", "203.0.113.2")],
                &["10.244.2.0/24"],
            ),
        ]
    }

    /// A node the API server never had.
    fn ghost(addrs: &[(&str, &str)], cidrs: &[&str]) -> NodeRecord {
        node("ghost", "g", addrs, cidrs)
    }

    /// The field, the record's value and who may be named as holder.
    type Want = Option<(Field, &'static str, &'static [&'static str])>;

    /// Records sharing an address (or none) with [`live_pair`].
    fn address_cases() -> Vec<(&'static str, NodeRecord, Want)> {
        vec![
            (
                "nothing shared",
                ghost(&[("InternalIP", "10.0.9.9")], &["10.244.9.0/24"]),
                None,
            ),
            (
                "a live InternalIP",
                ghost(&[("InternalIP", "10.0.0.1")], &[]),
                Some((Field::Address, "10.0.0.1", &["live-1"])),
            ),
            (
                "IPv4-mapped IPv6",
                ghost(&[("InternalIP", "::ffff:10.0.0.2")], &[]),
                Some((Field::Address, "::ffff:10.0.0.2", &["live-2"])),
            ),
            (
                "IPv6 spelled otherwise",
                ghost(&[("InternalIP", "fd00:0:0::0:1")], &[]),
                Some((Field::Address, "fd00:0:0::0:1", &["live-1"])),
            ),
            (
                "an ExternalIP",
                ghost(&[("ExternalIP", "203.0.113.2")], &[]),
                Some((Field::Address, "203.0.113.2", &["live-2"])),
            ),
            (
                "a pod IP of a live node as its address",
                ghost(&[("InternalIP", "10.244.1.7")], &[]),
                Some((Field::Address, "10.244.1.7", &["live-1"])),
            ),
            (
                "a Hostname that is a live node's name",
                ghost(&[("Hostname", "LIVE-2")], &[]),
                Some((Field::Address, "LIVE-2", &["live-2"])),
            ),
        ]
    }

    /// Records sharing a podCIDR, a name or a providerID with `live`, and
    /// the live node's own record.
    fn cidr_and_identity_cases(live: &[NodeRecord; 2]) -> Vec<(&'static str, NodeRecord, Want)> {
        vec![
            (
                "a live podCIDR",
                ghost(&[], &["10.244.2.0/24"]),
                Some((Field::PodCidr, "10.244.2.0/24", &["live-2"])),
            ),
            (
                "inside a live podCIDR",
                ghost(&[], &["10.244.2.128/25"]),
                Some((Field::PodCidr, "10.244.2.128/25", &["live-2"])),
            ),
            (
                "covering live podCIDRs",
                ghost(&[], &["10.244.0.0/16"]),
                Some((Field::PodCidr, "10.244.0.0/16", &["live-1", "live-2"])),
            ),
            (
                "covering live node IPs",
                ghost(&[], &["10.0.0.0/30"]),
                Some((Field::PodCidr, "10.0.0.0/30", &["live-1", "live-2"])),
            ),
            (
                "an IPv6 range covering a live one",
                ghost(&[], &["fd00:244::/32"]),
                Some((Field::PodCidr, "fd00:244::/32", &["live-1"])),
            ),
            (
                "everything",
                ghost(&[], &["::/0"]),
                Some((Field::PodCidr, "::/0", &["live-1", "live-2"])),
            ),
            (
                "an IPv4 /0 covers every IPv4",
                ghost(&[], &["0.0.0.0/0"]),
                Some((Field::PodCidr, "0.0.0.0/0", &["live-1", "live-2"])),
            ),
            (
                "a live name under another uid",
                node("live-1", "other", &[], &[]),
                Some((Field::Name, "live-1", &["live-1"])),
            ),
            (
                "a live node's record with a swapped uid",
                NodeRecord {
                    uid: "u1-forged".into(),
                    ..live[0].clone()
                },
                Some((Field::Name, "live-1", &["live-1"])),
            ),
            (
                "a live providerID",
                NodeRecord {
                    provider_id: Some("aws:///i-1".into()),
                    ..ghost(&[], &[])
                },
                Some((Field::ProviderId, "aws:///i-1", &["live-1"])),
            ),
            (
                "the live node itself (its name and uid)",
                live[0].clone(),
                None,
            ),
            (
                "another name under a live node's uid, with its IP",
                NodeRecord {
                    name: "ghost".into(),
                    ..live[1].clone()
                },
                Some((Field::Address, "10.0.0.2", &["live-2"])),
            ),
        ]
    }

    /// What a record shares with the live nodes, by field: IPs and CIDRs by
    /// what they address (overlap, any spelling), names and DNS addresses
    /// case-insensitively, the record itself (its uid) never.
    #[test]
    fn conflict_table() {
        let live = live_pair();
        let h = Holders::new(&live);
        let mut table = address_cases();
        table.extend(cidr_and_identity_cases(&live));
        for (what, r, want) in table {
            let got = h.conflict(&r);
            match (want, got) {
                (None, None) => {}
                (Some((field, value, holders)), Some(c)) => {
                    assert_eq!((c.field, c.value.as_str()), (field, value), "{what}");
                    assert!(holders.contains(&c.holder.as_str()), "{what}: {c:?}");
                }
                (want, got) => panic!("{what}: want {want:?}, got {got:?}"),
            }
        }
        // An IPv4 /0 stays in IPv4: an IPv6-only record shares nothing.
        let v6 = [node(
            "v6",
            "u6",
            &[("InternalIP", "fd00::6")],
            &["fd00:6::/64"],
        )];
        assert_eq!(
            Holders::new(&v6).conflict(&ghost(&[], &["0.0.0.0/0"])),
            None
        );
    }

    /// The index answers as a scan of every holder would, at 5,000 nodes
    /// with two IPs and two podCIDRs each.
    #[test]
    fn holders_at_5000_nodes() {
        let ip = |i: usize| format!("10.{}.{}.{}", i / 65_536 % 256, i / 256 % 256, i % 256);
        let live: Vec<NodeRecord> = (0..5000)
            .map(|i| {
                node(
                    &format!("n{i}"),
                    &format!("u{i}"),
                    &[
                        ("InternalIP", &ip(i)),
                        ("InternalIP", &format!("fd00::{i:x}")),
                    ],
                    &[
                        &format!("172.{}.{}.0/24", 16 + i / 256 % 16, i % 256),
                        &format!("fd01:{i:x}::/64"),
                    ],
                )
            })
            .collect();
        let h = Holders::new(&live);
        let started = Instant::now();
        let mut found = 0;
        for i in 0..5000 {
            let g = node(
                "ghost",
                "g",
                &[("InternalIP", &ip(i + 5000))],
                &[&format!("fd01:{:x}::/64", i + 5000)],
            );
            assert_eq!(h.conflict(&g), None);
            let g = node("ghost", "g", &[], &[&format!("fd01:{i:x}::1/128")]);
            found += usize::from(h.conflict(&g).is_some_and(|c| c.holder == format!("n{i}")));
        }
        assert_eq!(found, 5000);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
