//! The subcommands that print a manifest instead of serving: their flags
//! (the same taint flags as serving, [`GateFlags`]) and what each prints.

use nodegate_shared::gate_flags::{GateFlags, ReleaseFlags};

use crate::render::{confinement, policy, webhook_config};

/// Commands besides serving.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print the MutatingAdmissionPolicy and binding that taint Node creates
    /// and updates after a reboot inside the API server (Kubernetes ≥ 1.36),
    /// for the same taints.
    Policy(PolicyArgs),
    /// Print the ValidatingAdmissionPolicies that confine the agent's and the
    /// webhook's ServiceAccounts (Kubernetes ≥ 1.32), for the same taints.
    Confinement(ConfinementArgs),
    /// Print the MutatingWebhookConfiguration: the first line through every
    /// replica, then one backup line per replica, for the same taints.
    WebhookConfig(WebhookConfigArgs),
}

impl Command {
    /// The manifest this command prints, or why its flags are refused.
    pub fn render(&self) -> anyhow::Result<String> {
        Ok(match self {
            Command::Policy(p) => {
                p.gate.validate()?;
                policy::render(&p.gate.ordinary(), &p.gate.boot_taints, p.api_version)
            }
            Command::Confinement(c) => {
                c.gate.validate()?;
                c.release.validate(&c.gate)?;
                confinement::render(
                    &c.gate.ordinary(),
                    &c.gate.boot_taints,
                    &c.release.release_taints,
                )
            }
            Command::WebhookConfig(w) => {
                w.gate.validate()?;
                webhook_config::render(&w.gate.ordinary(), &w.gate.boot_taints, w.replicas)
            }
        })
    }
}

/// `nodegate-webhook policy` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub gate: GateFlags,
    /// `v1` (Kubernetes ≥ 1.36) or `v1beta1` (1.34–1.35, feature gate on).
    #[arg(long, default_value = "v1")]
    pub api_version: policy::ApiVersion,
}

/// `nodegate-webhook confinement` flags: the webhook's taints and the
/// agent's released ones.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfinementArgs {
    #[command(flatten)]
    pub gate: GateFlags,
    #[command(flatten)]
    pub release: ReleaseFlags,
}

/// `nodegate-webhook webhook-config` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookConfigArgs {
    #[command(flatten)]
    pub gate: GateFlags,
    /// The StatefulSet's replicas: one backup line each.
    #[arg(long, default_value_t = webhook_config::DEFAULT_REPLICAS,
          value_parser = clap::value_parser!(u32).range(1..=10))]
    pub replicas: u32,
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use nodegate_shared::keys::DEFAULT_TAINT;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    fn render(args: &[&str]) -> anyhow::Result<String> {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))?;
        cli.command.render()
    }

    /// Without `--taint` every command renders nodegate's default taint.
    #[test]
    fn the_default_taint_applies_without_a_taint() {
        let taint = [DEFAULT_TAINT.parse().unwrap()];
        assert_eq!(
            render(&["policy"]).unwrap(),
            policy::render(&taint, &[], policy::ApiVersion::V1)
        );
        assert_eq!(
            render(&["webhook-config"]).unwrap(),
            webhook_config::render(&taint, &[], webhook_config::DEFAULT_REPLICAS)
        );
        assert_eq!(
            render(&["confinement"]).unwrap(),
            confinement::render(&taint, &[], &[])
        );
    }

    #[test]
    fn contradicting_taints_are_refused() {
        let gate = "--boot-taint=nodegate.dev/agent-not-ready=true:NoSchedule";
        for command in ["policy", "webhook-config", "confinement"] {
            let err = render(&[command, gate]).unwrap_err().to_string();
            assert!(
                err.contains("must have effect NoExecute"),
                "{command}: {err}"
            );
            let err = render(&[
                command,
                "--taint=a/b:NoExecute",
                "--boot-taint=a/b:NoExecute",
            ])
            .unwrap_err()
            .to_string();
            assert!(err.contains("listed twice"), "{command}: {err}");
        }
        let err = render(&["confinement", &format!("--release-taint={DEFAULT_TAINT}")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("key and effect of a managed taint"), "{err}");
    }
}
