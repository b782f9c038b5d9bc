//! Deletion confirmation: whatever the node set's source says (a roster
//! shard anyone with ConfigMap write access in the namespace can forge), a
//! deletion handler runs only for a node the API server no longer has with
//! that uid. Each deletion is confirmed by one GET of the node by name: 404,
//! or another uid, means gone; the same uid means live (never handled);
//! any other error means ask again later.
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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::deletion::{DeleteSource, Deletion};
use crate::record::NodeRecord;

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
    /// Gone: run the handlers.
    Gone(Deletion),
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
    /// By uid.
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
            .filter(|(r, _)| !self.pending.contains_key(&r.uid))
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
                record.uid.clone(),
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
        let uid = self
            .pending
            .iter()
            .filter(|(_, p)| p.due <= now)
            .min_by_key(|(_, p)| p.due)
            .map(|(u, _)| u.clone())?;
        self.tokens = (self.tokens - 1.0).max(0.0);
        self.in_flight = Some(uid.clone());
        self.pending.get(&uid).map(|p| p.record.clone())
    }

    /// The answer to the GET of `uid`'s node.
    pub fn finish(&mut self, uid: &str, lookup: Lookup, now: Instant) -> Outcome {
        if self.in_flight.as_deref() == Some(uid) {
            self.in_flight = None;
        }
        let Some(mut p) = self.pending.remove(uid) else {
            return Outcome::Unknown;
        };
        match lookup {
            Lookup::Missing => Outcome::Gone((p.record, p.source)),
            Lookup::Uid(u) if !u.is_empty() && u != uid => Outcome::Gone((p.record, p.source)),
            Lookup::Uid(u) if u == uid => {
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
                self.pending.insert(uid.to_string(), p);
                Outcome::Retry
            }
        }
    }

    /// Deletions waiting for a confirmation.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Of those, the ones in held mass deletions.
    pub fn held(&self) -> usize {
        self.pending.values().filter(|p| p.batch.is_some()).count()
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
    /// returns the handled names, the refused names and the GETs made.
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
            match c.finish(&r.uid.clone(), answer(&r), at) {
                Outcome::Gone((r, _)) => gone.push(r.name),
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

    /// Truly deleted, or re-created under the name (another uid): gone.
    /// Errors are retried with backoff and never count as gone.
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
        assert_eq!(gone, vec!["n0", "n1", "n2"]);
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
                c.finish(&r.uid.clone(), Lookup::Uid(r.uid.clone()), at),
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
            c.finish(&r.uid, Lookup::Missing, at),
            Outcome::Gone(_)
        ));
        assert!(c.next_due().is_some());
    }
}
