//! The taints the agent works with, built once from the flags and shared
//! by the Node writer and the gate's rules, so what one writes is what the
//! other expects to find.

use nodegate_shared::TaintSpec;
use serde_json::Value;

/// The managed taints (the ordinary ones, gate by gate, then strict mode's
/// boot gate), the boot gate among them, and the released ones.
///
/// A set either covers every gate (`complete`: the ready patch also removes
/// the boot gate and the released taints and records the bootID) or, from
/// [`TaintSet::of_gates`], only some gates' taints: a gate opened while
/// others still hold the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintSet {
    managed: Vec<TaintSpec>,
    gates: Vec<Vec<TaintSpec>>,
    boot: Vec<TaintSpec>,
    release: Vec<TaintSpec>,
    complete: bool,
}

impl Default for TaintSet {
    fn default() -> Self {
        Self::new(Vec::new(), Vec::new(), Vec::new())
    }
}

impl TaintSet {
    /// One gate of `ordinary` taints; `ordinary` and `boot` are managed:
    /// removed when ready, added back. `release` is only removed, when a
    /// taint matches one exactly.
    pub fn new(ordinary: Vec<TaintSpec>, boot: Vec<TaintSpec>, release: Vec<TaintSpec>) -> Self {
        Self::with_gates(vec![ordinary], boot, release)
    }

    /// Several gates, each its own taints, opened independently.
    pub fn with_gates(
        gates: Vec<Vec<TaintSpec>>,
        boot: Vec<TaintSpec>,
        release: Vec<TaintSpec>,
    ) -> Self {
        let mut managed: Vec<TaintSpec> = gates.iter().flatten().cloned().collect();
        managed.extend(boot.iter().cloned());
        Self {
            managed,
            gates,
            boot,
            release,
            complete: true,
        }
    }

    /// The gates' taints, in order.
    pub fn gates(&self) -> &[Vec<TaintSpec>] {
        &self.gates
    }

    /// The set of the gates `mask` picks (by position): all of them is this
    /// whole set; fewer, only their taints, without the boot gate, the
    /// released taints or the bootID, which belong to the node's last gate.
    pub fn of_gates(&self, mask: &[bool]) -> TaintSet {
        let picked = |i: usize| mask.get(i).copied().unwrap_or(false);
        if (0..self.gates.len()).all(picked) {
            return self.clone();
        }
        let gates: Vec<Vec<TaintSpec>> = self
            .gates
            .iter()
            .enumerate()
            .filter(|(i, _)| picked(*i))
            .map(|(_, g)| g.clone())
            .collect();
        TaintSet {
            managed: gates.iter().flatten().cloned().collect(),
            gates,
            boot: Vec::new(),
            release: Vec::new(),
            complete: false,
        }
    }

    /// Every gate: a ready patch of this set records the bootID.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Every taint the agent manages (and removes when ready).
    pub fn managed(&self) -> &[TaintSpec] {
        &self.managed
    }

    /// Strict mode's boot gate: managed, but added only on a new boot.
    pub fn boot(&self) -> &[TaintSpec] {
        &self.boot
    }

    /// Taints an older configuration added: removed, never added.
    pub fn release(&self) -> &[TaintSpec] {
        &self.release
    }

    /// True when the ready patch removes `taint`: one the agent manages (by
    /// key and effect), or one it releases (exactly: key, value and effect,
    /// so a taint another writer keeps under the same key stays).
    pub fn removes(&self, taint: &Value) -> bool {
        self.managed.iter().any(|s| s.matches(taint))
            || self.release.iter().any(|r| r.matches_exactly(taint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(s: &str) -> TaintSpec {
        s.parse().unwrap()
    }

    #[test]
    fn the_boot_gate_is_managed_and_releases_match_exactly() {
        let set = TaintSet::new(
            vec![spec("a.dev/x=true:NoSchedule")],
            vec![spec("a.dev/x=true:NoExecute")],
            vec![spec("b.dev/old=true:NoSchedule")],
        );
        assert_eq!(set.managed().len(), 2);
        assert_eq!(set.boot(), [spec("a.dev/x=true:NoExecute")]);
        // Managed: key and effect; released: the value too.
        assert!(set.removes(&json!({"key": "a.dev/x", "value": "other", "effect": "NoExecute"})));
        assert!(set.removes(&json!({"key": "b.dev/old", "value": "true", "effect": "NoSchedule"})));
        assert!(!set.removes(&json!({"key": "b.dev/old", "effect": "NoSchedule"})));
    }

    #[test]
    fn some_gates_of_a_set_leave_the_boot_gate_and_the_releases_to_the_last() {
        let set = TaintSet::with_gates(
            vec![
                vec![spec("a.dev/x=true:NoSchedule")],
                vec![spec("c.dev/y=true:NoSchedule")],
            ],
            vec![spec("a.dev/x=true:NoExecute")],
            vec![spec("b.dev/old=true:NoSchedule")],
        );
        assert_eq!(set.managed().len(), 3);
        let first = set.of_gates(&[true, false]);
        assert!(!first.complete());
        assert_eq!(first.managed(), [spec("a.dev/x=true:NoSchedule")]);
        assert!(first.boot().is_empty() && first.release().is_empty());
        assert!(
            !first.removes(&json!({"key": "c.dev/y", "value": "true", "effect": "NoSchedule"}))
        );
        assert_eq!(set.of_gates(&[true, true]), set);
        assert!(set.of_gates(&[false, false]).managed().is_empty());
    }
}
