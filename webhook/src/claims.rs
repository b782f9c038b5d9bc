//! Reboots claimed by a re-registration, until a stored version confirms them.
//!
//! The re-taint of a re-registering node acts on the create's boot ID before
//! any stored version shows it: that is what closes the window before the
//! kubelet's status write. Only the node's kubelet, posting through the
//! configuration's secret path, can ask for it; a leaked path token lets
//! anyone claim a reboot. So each node gets at most one such re-taint per
//! interval, and each re-taint is checked later against the stored node: a
//! claimed boot that the node never reports is counted (and alerted on),
//! since no real reboot followed it. Pure: the caller brings the time and
//! reads the stored node.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What may be done with a re-registration's claim now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Re-taint, then [`Claims::record`] it if a patch was made.
    Go,
    /// The node was re-tainted on a claim less than the interval ago: not
    /// again. The status write of a real reboot still gates it, once stored.
    RateLimited,
}

/// How a claim ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The stored node reports the claimed boot.
    Confirmed,
    /// It does not, a timeout after the re-taint: no real reboot followed.
    Unconfirmed { stored_boot: Option<String> },
}

#[derive(Debug, Clone)]
struct Claim {
    boot: String,
    at: Instant,
    /// Found unconfirmed at its check (and counted); kept until the
    /// interval has passed, so it still holds the next re-taint back.
    unconfirmed: bool,
}

/// The open claims, one per node at most.
#[derive(Debug)]
pub struct Claims {
    min_interval: Duration,
    confirm_within: Duration,
    by_node: HashMap<String, Claim>,
}

impl Claims {
    pub fn new(min_interval: Duration, confirm_within: Duration) -> Self {
        Self {
            min_interval,
            confirm_within,
            by_node: HashMap::new(),
        }
    }

    /// Whether `node` may be re-tainted on a claim at `now`, given the boot
    /// the stored node reports. An open claim that the stored node now
    /// confirms is closed (a genuine reboot loop is never limited: each boot
    /// was reported before the next); one it does not confirm holds the next
    /// re-taint back until the interval has passed, then is closed as
    /// unconfirmed.
    pub fn admit(
        &mut self,
        node: &str,
        stored_boot: Option<&str>,
        now: Instant,
    ) -> (Admit, Option<Verdict>) {
        let Some(open) = self.by_node.get(node) else {
            return (Admit::Go, None);
        };
        let young = now.saturating_duration_since(open.at) < self.min_interval;
        let verdict = match (open.unconfirmed, stored_boot == Some(open.boot.as_str())) {
            (false, true) => Some(Verdict::Confirmed),
            _ if young => return (Admit::RateLimited, None),
            (false, false) => Some(Verdict::Unconfirmed {
                stored_boot: stored_boot.map(str::to_owned),
            }),
            // Counted at its check already.
            (true, _) => None,
        };
        self.by_node.remove(node);
        (Admit::Go, verdict)
    }

    /// A re-taint made at `now` on the claim of `boot`.
    pub fn record(&mut self, node: &str, boot: &str, now: Instant) {
        self.by_node.insert(
            node.to_owned(),
            Claim {
                boot: boot.to_owned(),
                at: now,
                unconfirmed: false,
            },
        );
    }

    /// Nodes whose claim is due for its check at `now`, with the boot each
    /// claimed; they stay open until [`Claims::settle`]. Claims checked
    /// before whose interval has passed are dropped here.
    pub fn due(&mut self, now: Instant) -> Vec<(String, String)> {
        let min = self.min_interval;
        self.by_node
            .retain(|_, c| !c.unconfirmed || now.saturating_duration_since(c.at) < min);
        let mut due: Vec<(String, String)> = self
            .by_node
            .iter()
            .filter(|(_, c)| {
                !c.unconfirmed && now.saturating_duration_since(c.at) >= self.confirm_within
            })
            .map(|(n, c)| (n.clone(), c.boot.clone()))
            .collect();
        due.sort();
        due
    }

    /// Checks `node`'s claim of `boot` against the boot the stored node
    /// reports (`None`: no node, or no boot ID). A confirmed claim closes; an
    /// unconfirmed one is counted once and still holds the next re-taint
    /// back until the interval has passed. A claim replaced meanwhile by a
    /// newer one is left alone.
    pub fn settle(&mut self, node: &str, boot: &str, stored: Option<&str>) -> Option<Verdict> {
        let open = self.by_node.get_mut(node)?;
        if open.boot != boot || open.unconfirmed {
            return None;
        }
        if stored == Some(boot) {
            self.by_node.remove(node);
            return Some(Verdict::Confirmed);
        }
        open.unconfirmed = true;
        Some(Verdict::Unconfirmed {
            stored_boot: stored.map(str::to_owned),
        })
    }

    pub fn open(&self) -> usize {
        self.by_node.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_unconfirmed_claim_holds_the_next_back_for_the_interval() {
        let t0 = Instant::now();
        let mut c = Claims::new(30 * S, 120 * S);
        assert_eq!(c.admit("a", Some("boot-1"), t0), (Admit::Go, None));
        c.record("a", "boot-2", t0);
        // Forged: the stored node still runs boot-1.
        assert_eq!(
            c.admit("a", Some("boot-1"), t0 + 29 * S),
            (Admit::RateLimited, None)
        );
        assert_eq!(
            c.admit("b", Some("boot-1"), t0 + 29 * S),
            (Admit::Go, None),
            "per node"
        );
        assert_eq!(
            c.admit("a", Some("boot-1"), t0 + 30 * S),
            (
                Admit::Go,
                Some(Verdict::Unconfirmed {
                    stored_boot: Some("boot-1".into())
                })
            )
        );
    }

    #[test]
    fn a_genuine_reboot_loop_is_never_held_back() {
        let t0 = Instant::now();
        let mut c = Claims::new(30 * S, 120 * S);
        c.record("a", "boot-2", t0);
        // The kubelet reported boot-2 before crashing again a second later.
        assert_eq!(
            c.admit("a", Some("boot-2"), t0 + S),
            (Admit::Go, Some(Verdict::Confirmed))
        );
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn a_claim_is_checked_once_its_time_is_up() {
        let t0 = Instant::now();
        let mut c = Claims::new(150 * S, 120 * S);
        c.record("real", "boot-2", t0);
        c.record("forged", "boot-9", t0 + S);
        assert!(c.due(t0 + 119 * S).is_empty());
        assert_eq!(
            c.due(t0 + 121 * S),
            [
                ("forged".to_string(), "boot-9".to_string()),
                ("real".to_string(), "boot-2".to_string())
            ]
        );
        assert_eq!(
            c.settle("real", "boot-2", Some("boot-2")),
            Some(Verdict::Confirmed)
        );
        assert_eq!(
            c.settle("forged", "boot-9", Some("boot-1")),
            Some(Verdict::Unconfirmed {
                stored_boot: Some("boot-1".into())
            })
        );
        assert_eq!(c.settle("real", "boot-2", Some("boot-2")), None, "once");
        assert_eq!(
            c.settle("forged", "boot-9", Some("boot-1")),
            None,
            "counted once"
        );
        // The unconfirmed claim still holds the next re-taint back…
        assert_eq!(
            c.admit("forged", Some("boot-1"), t0 + 121 * S),
            (Admit::RateLimited, None)
        );
        assert!(c.due(t0 + 121 * S).is_empty());
        assert_eq!(c.open(), 1);
        // …for its interval only, and is then dropped.
        assert!(c.due(t0 + 200 * S).is_empty());
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn a_newer_claim_keeps_its_own_check() {
        let t0 = Instant::now();
        let mut c = Claims::new(S, 10 * S);
        c.record("a", "boot-2", t0);
        c.record("a", "boot-3", t0 + 5 * S);
        assert_eq!(c.settle("a", "boot-2", Some("boot-3")), None);
        assert_eq!(c.open(), 1);
        assert_eq!(
            c.settle("a", "boot-3", None),
            Some(Verdict::Unconfirmed { stored_boot: None })
        );
        assert_eq!(c.settle("a", "boot-3", None), None);
    }
}
