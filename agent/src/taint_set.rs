//! The taints the agent works with, built once from the flags and shared
//! by the Node writer and the gate's rules, so what one writes is what the
//! other expects to find.

use nodegate_shared::TaintSpec;
use serde_json::Value;

/// The managed taints (the ordinary ones, then strict mode's boot gate),
/// the boot gate among them, and the released ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaintSet {
    managed: Vec<TaintSpec>,
    boot: Vec<TaintSpec>,
    release: Vec<TaintSpec>,
}

impl TaintSet {
    /// `ordinary` and `boot` are managed: removed when ready, added back.
    /// `release` is only removed, when a taint matches one exactly.
    pub fn new(ordinary: Vec<TaintSpec>, boot: Vec<TaintSpec>, release: Vec<TaintSpec>) -> Self {
        let mut managed = ordinary;
        managed.extend(boot.iter().cloned());
        Self {
            managed,
            boot,
            release,
        }
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
}
