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
    /// Free pod slots on nodes rebooting with their gate closed when this
    /// NodeClaim was launched: room the pods could have had.
    pub rebooting_room_at_launch: usize,
}

/// One node's reboot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebootRecord {
    pub node: String,
    /// The kubelet's start on the new boot.
    pub rebooted_at: Duration,
    /// Pods bound to it then.
    pub pods: usize,
    /// The Node stored after the kubelet's start carried the gate (the
    /// webhook's, added while it answered the kubelet's create).
    pub gated_after_reboot: bool,
    /// …and still carried `karpenter.sh/initialized=true`.
    pub initialized_after_reboot: bool,
    pub ready_at: Option<Duration>,
    pub gate_opened_at: Option<Duration>,
}

/// The reboot wave and the pods that arrived during it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaveRecord {
    /// The first reboot.
    pub at: Duration,
    pub reboots: Vec<RebootRecord>,
    /// Pods created after the initial ones.
    pub pods_arrived: usize,
    /// When the last of them was bound, if all were.
    pub pods_bound_at: Option<Duration>,
    /// Nodes the arrived pods were bound to, with how many.
    pub bound_to: BTreeMap<String, usize>,
}

/// One scheduling pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassRecord {
    pub at: Duration,
    pub pending: usize,
    pub launched: usize,
    /// Taint key → pods it turned away from a node with room.
    pub refused_by_taint: BTreeMap<String, usize>,
    /// Free pod slots on nodes rebooting with their gate closed.
    pub rebooting_room: usize,
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
    pub wave: Option<WaveRecord>,
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

    /// NodeClaims launched from the first reboot on.
    pub fn wave_launched(&self) -> Vec<&ClaimRecord> {
        let Some(w) = &self.wave else {
            return Vec::new();
        };
        self.claims
            .iter()
            .filter(|c| c.launched_at >= w.at)
            .collect()
    }

    /// NodeClaims launched while nodes rebooting behind their gate had room.
    pub fn wave_duplicates(&self) -> usize {
        self.claims
            .iter()
            .filter(|c| c.rebooting_room_at_launch > 0)
            .count()
    }

    /// The longest time a rebooted node kept its gate.
    pub fn wave_gated(&self) -> Option<Duration> {
        let w = self.wave.as_ref()?;
        w.reboots
            .iter()
            .filter_map(|r| Some(r.gate_opened_at? - r.rebooted_at))
            .max()
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
        if let Some(w) = &self.wave {
            let launched = self.wave_launched();
            f.extend([
                ("wave_nodes_rebooted", w.reboots.len().to_string()),
                ("wave_pods_arrived", w.pods_arrived.to_string()),
                ("wave_nodeclaims_launched", launched.len().to_string()),
                ("wave_duplicates", self.wave_duplicates().to_string()),
                (
                    "wave_empty_nodes",
                    launched.iter().filter(|c| c.pods == 0).count().to_string(),
                ),
            ]);
            if let Some(d) = self.wave_gated() {
                f.push(("wave_gated_seconds", format!("{:.1}", d.as_secs_f64())));
            }
            if let Some(at) = w.pods_bound_at {
                let after = at.saturating_sub(w.at);
                f.push((
                    "wave_pods_bound_seconds_after_reboot",
                    format!("{:.1}", after.as_secs_f64()),
                ));
            }
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
            wave: None,
        };
        let lines = o.figures("a");
        assert!(lines.contains(&"FIGURE karpenter.a.duplicates 1".to_string()));
        assert!(lines.contains(&"FIGURE karpenter.a.initialized_while_gated 2".to_string()));
        assert!(lines.contains(&"FIGURE karpenter.a.pods_bound_seconds 56.0".to_string()));
        assert!(lines.contains(&"FIGURE karpenter.a.empty_nodes 1".to_string()));
        assert!(!lines.iter().any(|l| l.contains(".wave_")));
    }

    #[test]
    fn wave_figures() {
        let s = Duration::from_secs;
        let o = Outcome {
            needed: 1,
            pods: 4,
            claims: vec![
                ClaimRecord {
                    pods: 3,
                    ..Default::default()
                },
                ClaimRecord {
                    launched_at: s(130),
                    rebooting_room_at_launch: 2,
                    ..Default::default()
                },
            ],
            wave: Some(WaveRecord {
                at: s(120),
                reboots: vec![RebootRecord {
                    rebooted_at: s(120),
                    gate_opened_at: Some(s(157)),
                    ..Default::default()
                }],
                pods_arrived: 1,
                pods_bound_at: Some(s(157)),
                bound_to: BTreeMap::new(),
            }),
            ..Default::default()
        };
        let lines = o.figures("f");
        for want in [
            "wave_nodes_rebooted 1",
            "wave_nodeclaims_launched 1",
            "wave_duplicates 1",
            "wave_empty_nodes 1",
            "wave_gated_seconds 37.0",
            "wave_pods_bound_seconds_after_reboot 37.0",
        ] {
            let line = format!("FIGURE karpenter.f.{want}");
            assert!(lines.contains(&line), "{line} not in {lines:#?}");
        }
    }
}
