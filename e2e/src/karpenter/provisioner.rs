//! When the provisioner runs, in virtual time: a pending pod is reconciled
//! when it appears and every 10 s while it stays pending; each reconcile
//! triggers the batcher; a batch closes 1 s after the last new trigger or
//! 10 s after the first; then one scheduling pass covers every pending pod.
//!
//! Upstream: `pkg/controllers/provisioning/controller.go`
//! `PodController.Reconcile` (`Trigger`, then `RequeueAfter: 10 *
//! time.Second` while `IsProvisionable`); `batcher.go` `Batcher.Trigger`
//! (an element already in the window neither re-arms nor extends it) and
//! `Wait` (the window opens at the first trigger, the idle timer restarts
//! on each new one); `pkg/operator/options/options.go`
//! `--batch-idle-duration` 1 s, `--batch-max-duration` 10 s;
//! `provisioner.go` `Provisioner.Reconcile` (one `Schedule` per batch, over
//! `GetPendingPods`, not only the triggering ones).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The provisioner's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// `RequeueAfter` of a pending pod's reconcile.
    pub requeue: Duration,
    pub batch_idle: Duration,
    pub batch_max: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            requeue: Duration::from_secs(10),
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(10),
        }
    }
}

/// The pod controller's queue: when each watched pod is reconciled next.
#[derive(Debug, Clone, Default)]
pub struct PodController {
    requeue: Duration,
    next: BTreeMap<String, Duration>,
}

impl PodController {
    pub fn new(requeue: Duration) -> Self {
        Self {
            requeue,
            next: BTreeMap::new(),
        }
    }

    /// A pod appeared (a watch event): reconciled at once.
    pub fn watch(&mut self, pod: &str, now: Duration) {
        self.next.insert(pod.to_string(), now);
    }

    /// The pods due at `now`.
    pub fn due(&self, now: Duration) -> Vec<String> {
        self.next
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// After a reconcile: requeued while provisionable, else dropped.
    pub fn reconciled(&mut self, pod: &str, provisionable: bool, now: Duration) {
        if provisionable {
            self.next.insert(pod.to_string(), now + self.requeue);
        } else {
            self.next.remove(pod);
        }
    }

    pub fn next_at(&self) -> Option<Duration> {
        self.next.values().min().copied()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    opened: Duration,
    idle_until: Duration,
}

/// `Batcher`.
#[derive(Debug, Clone)]
pub struct Batcher {
    idle: Duration,
    max: Duration,
    window: Option<Window>,
    elems: BTreeSet<String>,
}

impl Batcher {
    pub fn new(t: &Timers) -> Self {
        Self {
            idle: t.batch_idle,
            max: t.batch_max,
            window: None,
            elems: BTreeSet::new(),
        }
    }

    /// `Trigger`: opens a window, or restarts its idle timer for an element
    /// not seen in it yet.
    pub fn trigger(&mut self, elem: &str, now: Duration) {
        if !self.elems.insert(elem.to_string()) {
            return;
        }
        let idle_until = now + self.idle;
        self.window = Some(match self.window {
            None => Window {
                opened: now,
                idle_until,
            },
            Some(w) => Window { idle_until, ..w },
        });
    }

    /// When the open window ends (`Wait` returns true).
    pub fn closes_at(&self) -> Option<Duration> {
        self.window.map(|w| w.idle_until.min(w.opened + self.max))
    }

    /// Ends the window if due; true if a scheduling pass runs now.
    pub fn close_if_due(&mut self, now: Duration) -> bool {
        if self.closes_at().is_none_or(|at| at > now) {
            return false;
        }
        self.window = None;
        self.elems.clear();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_millis(x * 100)
    }

    #[test]
    fn pods_requeue_every_ten_seconds_while_pending() {
        let mut c = PodController::new(Duration::from_secs(10));
        c.watch("a", s(0));
        c.watch("b", s(3));
        assert_eq!(c.due(s(0)), vec!["a"]);
        c.reconciled("a", true, s(0));
        assert_eq!(c.next_at(), Some(s(3)));
        c.reconciled("b", false, s(3));
        assert_eq!(c.next_at(), Some(s(100)));
        assert!(c.due(s(99)).is_empty());
    }

    #[test]
    fn batch_closes_when_idle_or_at_its_maximum() {
        let mut b = Batcher::new(&Timers::default());
        assert!(!b.close_if_due(s(0)));
        b.trigger("a", s(0));
        b.trigger("b", s(5));
        // A pod already in the window does not extend it.
        b.trigger("a", s(9));
        assert_eq!(b.closes_at(), Some(s(15)));
        assert!(!b.close_if_due(s(14)));
        assert!(b.close_if_due(s(15)));
        assert_eq!(b.closes_at(), None);
        // New pods every 0.5 s: the window ends 10 s after it opened.
        for i in 0..30 {
            b.trigger(&format!("p{i}"), s(20 + 5 * i));
        }
        assert_eq!(b.closes_at(), Some(s(120)));
    }
}
