//! What a run did, and its figures as `FIGURE karpenter.<scenario>.<name>
//! <value>` lines.

use std::collections::BTreeMap;
use std::time::Duration;

/// One NodeClaim's life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimRecord {
    pub name: String,
    pub launched_at: Duration,
    /// The Node came back from its create carrying the gate (the webhook's).
    pub gated_at_create: bool,
    pub registered_at: Option<Duration>,
    pub ready_at: Option<Duration>,
    pub gate_opened_at: Option<Duration>,
    pub initialized_at: Option<Duration>,
    /// The Node still carried the gate when Karpenter labelled it initialized.
    pub initialized_while_gated: bool,
    /// Pods bound to it at the end.
    pub pods: usize,
}

/// One scheduling pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassRecord {
    pub at: Duration,
    pub pending: usize,
    pub launched: usize,
    /// Taint key → pods it turned away from a node with room.
    pub refused_by_taint: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Nodes the pods need: pods over slots per node, rounded up.
    pub needed: usize,
    pub pods: usize,
    pub claims: Vec<ClaimRecord>,
    pub passes: Vec<PassRecord>,
    /// When the last pod was bound, if all were.
    pub pods_bound_at: Option<Duration>,
}

impl Outcome {
    pub fn launched(&self) -> usize {
        self.claims.len()
    }

    /// NodeClaims beyond the ones needed.
    pub fn duplicates(&self) -> usize {
        self.launched().saturating_sub(self.needed)
    }

    pub fn initialized_while_gated(&self) -> usize {
        self.claims
            .iter()
            .filter(|c| c.initialized_while_gated)
            .count()
    }

    /// Nodes that got no pod.
    pub fn empty_nodes(&self) -> usize {
        self.claims.iter().filter(|c| c.pods == 0).count()
    }

    /// Passes that launched a NodeClaim.
    pub fn launching_passes(&self) -> usize {
        self.passes.iter().filter(|p| p.launched > 0).count()
    }

    /// The figure lines of `scenario`.
    pub fn figures(&self, scenario: &str) -> Vec<String> {
        let mut f = vec![
            ("nodeclaims_launched", self.launched().to_string()),
            ("nodeclaims_needed", self.needed.to_string()),
            ("duplicates", self.duplicates().to_string()),
            (
                "initialized_while_gated",
                self.initialized_while_gated().to_string(),
            ),
            ("empty_nodes", self.empty_nodes().to_string()),
            ("provisioning_passes", self.passes.len().to_string()),
            ("launching_passes", self.launching_passes().to_string()),
        ];
        if let Some(at) = self.pods_bound_at {
            f.push(("pods_bound_seconds", format!("{:.1}", at.as_secs_f64())));
        }
        f.into_iter()
            .map(|(name, v)| format!("FIGURE karpenter.{scenario}.{name} {v}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_lines() {
        let claim = |pods, gated| ClaimRecord {
            pods,
            initialized_while_gated: gated,
            ..Default::default()
        };
        let o = Outcome {
            needed: 1,
            pods: 3,
            claims: vec![claim(3, true), claim(0, true)],
            passes: vec![PassRecord {
                launched: 1,
                ..Default::default()
            }],
            pods_bound_at: Some(Duration::from_millis(56_000)),
        };
        let lines = o.figures("a");
        assert!(lines.contains(&"FIGURE karpenter.a.duplicates 1".to_string()));
        assert!(lines.contains(&"FIGURE karpenter.a.initialized_while_gated 2".to_string()));
        assert!(lines.contains(&"FIGURE karpenter.a.pods_bound_seconds 56.0".to_string()));
        assert!(lines.contains(&"FIGURE karpenter.a.empty_nodes 1".to_string()));
    }
}
