//! The taint flags, declared once and flattened into every binary that reads
//! them (`nodegate-webhook` and its generators, `nodegate-agent`,
//! `nodegate-check`), so the three parse, name and document them alike.

use crate::keys::DEFAULT_TAINT;
use crate::taint::{
    TaintError, TaintSpec, check_release, check_taints, check_unique, release_set, shipped_gates,
};

/// `--taint` and `--boot-taint`: the gate the webhook adds and the agent
/// removes.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct GateFlags {
    /// Taint nodegate gates with, `key[=value]:Effect` (repeatable;
    /// comma-separated in the environment variable). The webhook and the
    /// agent must name the same. Without it: nodegate.dev/agent-not-ready=true:NoSchedule
    /// (nodegate-check: what the webhook StatefulSet's flags name).
    #[arg(long = "taint", env = "NODEGATE_TAINTS", value_delimiter = ',')]
    pub taints: Vec<TaintSpec>,
    /// Strict mode's boot gate, `key[=value]:NoExecute` (repeatable): added
    /// with the taints on a new node or a new boot, so the kubelet refuses
    /// the pods already bound to a rebooted node until its agent is ready;
    /// removed with them; never added on the boot the agent recorded as
    /// ready. The webhook and the agent must name the same.
    #[arg(
        long = "boot-taint",
        env = "NODEGATE_BOOT_TAINTS",
        value_delimiter = ','
    )]
    pub boot_taints: Vec<TaintSpec>,
}

impl GateFlags {
    /// Either flag was given (nodegate-check otherwise reads the installed ones).
    pub fn given(&self) -> bool {
        !self.taints.is_empty() || !self.boot_taints.is_empty()
    }

    /// The ordinary taints: `--taint`, else nodegate's default.
    pub fn ordinary(&self) -> Vec<TaintSpec> {
        if self.taints.is_empty() {
            DEFAULT_TAINT.parse().into_iter().collect()
        } else {
            self.taints.clone()
        }
    }

    /// Every taint of the gate: the ordinary ones, then the boot gate.
    pub fn all(&self) -> Vec<TaintSpec> {
        let mut all = self.ordinary();
        all.extend(self.boot_taints.iter().cloned());
        all
    }

    /// No duplicate across both lists, every boot taint NoExecute.
    pub fn validate(&self) -> Result<(), TaintError> {
        check_taints(&self.ordinary(), &self.boot_taints)
    }
}

/// `--release-taint`: taints the agent removes with its ready patch when
/// they match exactly (key, value and effect) and never adds, besides the
/// built-in ones ([`ReleaseFlags::effective`]); the confinement lets its
/// token do exactly that.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ReleaseFlags {
    /// A taint to remove with the ready patch when it matches exactly (key,
    /// value and effect), never to add: one an older configuration added
    /// (`components/release-cilium-key` releases the old default,
    /// `node.cilium.io/agent-not-ready=true:NoSchedule`, for an upgrade);
    /// repeatable. Built in besides: every other gate nodegate ships (each
    /// key profile's taint, and its NoExecute boot gate) that --taint and
    /// --boot-taint do not name.
    #[arg(
        long = "release-taint",
        env = "NODEGATE_RELEASE_TAINTS",
        value_delimiter = ','
    )]
    pub release_taints: Vec<TaintSpec>,
}

impl ReleaseFlags {
    /// None of them is a taint of the gate, and none repeats.
    pub fn validate(&self, gate: &GateFlags) -> Result<(), TaintError> {
        check_release(&gate.all(), &self.release_taints)
    }

    /// What the agent releases under `gate`: these flags, then every gate
    /// nodegate ships that `gate` does not hold ([`release_set`], which the
    /// confinement generator calls too).
    pub fn effective(&self, gate: &GateFlags) -> Vec<TaintSpec> {
        release_set(&gate.all(), &self.release_taints)
    }
}

/// `--owned-taint`: gates another component removes (a CSI node plugin,
/// a device plugin). The webhook adds them with its own at a Node's create
/// and on a new boot, never on a later write of the same boot (the owner's
/// removal would be undone, and the two would fight); nodegate's agent
/// never adds or removes them, and its confinement keeps its token off them.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct OwnedFlags {
    /// A taint another component removes, `key[=value]:Effect` (repeatable;
    /// comma-separated in the environment variable): added at a Node's
    /// create and at a new boot, with the taints, and never removed by
    /// nodegate.
    #[arg(
        long = "owned-taint",
        env = "NODEGATE_OWNED_TAINTS",
        value_delimiter = ','
    )]
    pub owned_taints: Vec<TaintSpec>,
}

/// Why `--owned-taint`s were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnedError {
    #[error(transparent)]
    Taint(#[from] TaintError),
    /// A shipped gate is nodegate's: its agents release it when they do not
    /// hold it, and a NoSchedule one stands in for nodegate's own gate (the
    /// backup lines would fall silent on a node carrying only the owner's).
    #[error(
        "owned taint {0} has the key and effect of a gate nodegate ships: nodegate's agents release it, so another component cannot own it"
    )]
    Shipped(String),
}

impl OwnedFlags {
    /// No owned taint repeats, shares a key and effect with `gate`'s
    /// taints, or is a gate nodegate ships.
    pub fn validate(&self, gate: &GateFlags) -> Result<(), OwnedError> {
        if let Some(o) = self.owned_taints.iter().find(|o| {
            shipped_gates()
                .iter()
                .any(|s| s.key() == o.key() && s.effect() == o.effect())
        }) {
            return Err(OwnedError::Shipped(o.to_string()));
        }
        let mut all = gate.all();
        all.extend(self.owned_taints.iter().cloned());
        check_unique(&all)?;
        Ok(())
    }

    /// `release` (the agent's `--release-taint`s) names no owned taint: the
    /// agent never removes one.
    pub fn validate_release(&self, release: &ReleaseFlags) -> Result<(), TaintError> {
        check_release(&self.owned_taints, &release.release_taints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        gate: GateFlags,
        #[command(flatten)]
        release: ReleaseFlags,
        #[command(flatten)]
        owned: OwnedFlags,
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn the_default_applies_only_without_a_taint() {
        let none = parse(&[]);
        assert!(!none.gate.given());
        assert_eq!(none.gate.ordinary(), vec![DEFAULT_TAINT.parse().unwrap()]);
        let some = parse(&[
            "--taint=a.dev/x:NoSchedule",
            "--boot-taint=a.dev/x:NoExecute",
        ]);
        assert!(some.gate.given());
        assert_eq!(
            some.gate.all(),
            vec![
                "a.dev/x:NoSchedule".parse::<TaintSpec>().unwrap(),
                "a.dev/x:NoExecute".parse().unwrap()
            ]
        );
        assert!(some.gate.validate().is_ok());
    }

    #[test]
    fn contradictions_are_refused() {
        let boot_noschedule = parse(&["--boot-taint=a.dev/x:NoSchedule"]);
        assert!(boot_noschedule.gate.validate().is_err());
        let released_gate = parse(&[&format!("--release-taint={DEFAULT_TAINT}")]);
        assert!(released_gate.release.validate(&released_gate.gate).is_err());
        let legacy = parse(&["--release-taint=node.cilium.io/agent-not-ready=true:NoSchedule"]);
        assert!(legacy.release.validate(&legacy.gate).is_ok());
    }

    /// The flags' releases come first, then the shipped gates not held.
    #[test]
    fn the_effective_release_adds_the_shipped_gates_not_held() {
        let legacy = "node.cilium.io/agent-not-ready=true:NoSchedule";
        let cli = parse(&[&format!("--release-taint={legacy}")]);
        let effective = cli.release.effective(&cli.gate);
        assert_eq!(effective[0].to_string(), legacy);
        assert_eq!(effective[1..], release_set(&cli.gate.all(), &[]));
        assert!(!effective.iter().any(|r| r.to_string() == DEFAULT_TAINT));
    }

    /// An owned taint is another component's: it may not be one of
    /// nodegate's taints (same key and effect), one of the gates nodegate
    /// ships, nor released by the agent.
    #[test]
    fn owned_taints_are_refused_where_nodegate_would_touch_them() {
        let ebs = "ebs.csi.aws.com/agent-not-ready:NoExecute";
        let ok = parse(&[&format!("--owned-taint={ebs}")]);
        assert!(ok.owned.validate(&ok.gate).is_ok());
        assert_eq!(ok.owned.owned_taints[0].to_string(), ebs);
        let cases: [(&[&str], &str); 4] = [
            (
                &[
                    "--taint=example.com/x:NoSchedule",
                    "--owned-taint=example.com/x=y:NoSchedule",
                ],
                "listed twice",
            ),
            (
                &[
                    "--boot-taint=example.com/x:NoExecute",
                    "--owned-taint=example.com/x:NoExecute",
                ],
                "listed twice",
            ),
            (
                &[
                    &format!("--owned-taint={ebs}"),
                    &format!("--owned-taint={ebs}"),
                ],
                "listed twice",
            ),
            (
                &[
                    "--taint=example.com/x:NoSchedule",
                    "--owned-taint=readiness.k8s.io/nodegate-agent-not-ready=true:NoSchedule",
                ],
                "a gate nodegate ships",
            ),
        ];
        for (args, want) in cases {
            let cli = parse(args);
            let err = cli.owned.validate(&cli.gate).unwrap_err().to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
        let released = parse(&[
            &format!("--owned-taint={ebs}"),
            &format!("--release-taint={ebs}"),
        ]);
        assert!(released.owned.validate_release(&released.release).is_err());
    }
}
