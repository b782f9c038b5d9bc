//! The taint flags, declared once and flattened into every binary that reads
//! them (`nodegate-webhook` and its generators, `nodegate-agent`,
//! `nodegate-check`), so the three parse, name and document them alike.

use crate::keys::DEFAULT_TAINT;
use crate::taint::{TaintError, TaintSpec, check_release, check_taints, release_set};

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
}
