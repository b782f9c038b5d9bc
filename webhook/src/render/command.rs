//! The subcommands that print a manifest instead of serving: their flags
//! (the same taint flags as serving, [`GateFlags`] and [`OwnedFlags`]) and
//! what each prints; `gates-component` writes a directory instead.

use std::path::{Path, PathBuf};

use anyhow::Context;
use nodegate_shared::gate_flags::{GateFlags, OwnedFlags, ReleaseFlags};

use crate::render::{confinement, gates_component, policy, webhook_config};

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
    /// Write a kustomize Component that turns the base install into the
    /// gates of a declaration (docs/gates.md): the webhook's and the agent's
    /// flags, the confinement, the webhook configuration and the admission
    /// policy for them, and the declaration itself.
    GatesComponent(GatesComponentArgs),
}

impl Command {
    /// The manifest this command prints, or why its flags are refused.
    pub fn render(&self) -> anyhow::Result<String> {
        Ok(match self {
            Command::Policy(p) => {
                p.gate.validate()?;
                p.owned.validate(&p.gate)?;
                policy::render_owned(
                    &p.gate.ordinary(),
                    &p.gate.boot_taints,
                    &p.owned.owned_taints,
                    p.api_version,
                )
            }
            Command::Confinement(c) => {
                c.gate.validate()?;
                c.owned.validate(&c.gate)?;
                c.release.validate(&c.gate)?;
                c.owned.validate_release(&c.release)?;
                confinement::render_owned(
                    &c.gate.ordinary(),
                    &c.gate.boot_taints,
                    &c.owned.owned_taints,
                    &c.release.release_taints,
                )
            }
            Command::WebhookConfig(w) => {
                w.gate.validate()?;
                w.owned.validate(&w.gate)?;
                webhook_config::render_owned(
                    &w.gate.ordinary(),
                    &w.gate.boot_taints,
                    &w.owned.owned_taints,
                    w.replicas,
                )
            }
            Command::GatesComponent(g) => write_component(g)?,
        })
    }
}

/// Writes the component's files into `--out` (created if missing) and
/// says which.
fn write_component(args: &GatesComponentArgs) -> anyhow::Result<String> {
    let declaration = std::fs::read_to_string(&args.gates)
        .with_context(|| format!("reading --gates {}", args.gates.display()))?;
    let files = gates_component::render(&declaration, args.replicas)
        .with_context(|| format!("--gates {}", args.gates.display()))?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating --out {}", args.out.display()))?;
    let mut written = String::new();
    for f in files {
        let path = Path::new(&args.out).join(f.name);
        std::fs::write(&path, f.text).with_context(|| format!("writing {}", path.display()))?;
        written.push_str(&format!("wrote {}\n", path.display()));
    }
    Ok(written)
}

/// `nodegate-webhook policy` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub gate: GateFlags,
    #[command(flatten)]
    pub owned: OwnedFlags,
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
    pub owned: OwnedFlags,
    #[command(flatten)]
    pub release: ReleaseFlags,
}

/// `nodegate-webhook webhook-config` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookConfigArgs {
    #[command(flatten)]
    pub gate: GateFlags,
    #[command(flatten)]
    pub owned: OwnedFlags,
    /// The StatefulSet's replicas: one backup line each.
    #[arg(long, default_value_t = webhook_config::DEFAULT_REPLICAS,
          value_parser = clap::value_parser!(u32).range(1..=10))]
    pub replicas: u32,
}

/// `nodegate-webhook gates-component` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct GatesComponentArgs {
    /// The gates declaration (YAML or JSON; docs/gates.md).
    #[arg(long)]
    pub gates: PathBuf,
    /// The component's directory: kustomization.yaml, the generated
    /// manifests and a copy of the declaration are written there.
    #[arg(long)]
    pub out: PathBuf,
    /// The webhook StatefulSet's replicas: one backup line each (the base
    /// runs 2; another number is patched in, with a Service per replica).
    #[arg(long, default_value_t = webhook_config::DEFAULT_REPLICAS,
          value_parser = clap::value_parser!(u32).range(1..=10))]
    pub replicas: u32,
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use nodegate_shared::TaintSpec;
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

    /// Every generated confinement.yaml under manifests/ is the output of
    /// the command its header names, and the five configurations nodegate
    /// ships and the two gates components each have one.
    #[test]
    fn every_shipped_confinement_is_its_headers_command_output() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        let mut found = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.file_name().is_some_and(|n| n == "confinement.yaml") {
                    found.push(path);
                }
            }
        }
        let mut names: Vec<String> = Vec::new();
        for path in &found {
            let shipped = std::fs::read_to_string(path).unwrap();
            let command = shipped
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# Generated by `nodegate-webhook "))
                .and_then(|l| l.strip_suffix("`; do not edit:"))
                .unwrap_or_else(|| panic!("{}: no generator header", path.display()));
            let args: Vec<&str> = command.split_whitespace().collect();
            assert_eq!(args[0], "confinement", "{}", path.display());
            assert!(
                render(&args).unwrap() == shipped,
                "{} differs from `nodegate-webhook {command}`; regenerate it:\n\
                 cargo build -p nodegate-webhook && ./target/debug/nodegate-webhook {command} > {}",
                path.display(),
                path.display()
            );
            let rel = path.strip_prefix(&root).unwrap().parent().unwrap();
            names.push(rel.to_string_lossy().into_owned());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "base",
                "components/gates/cilium-ebs-csi",
                "components/gates/cilium-gpu",
                "components/key-profiles/cluster-autoscaler",
                "components/key-profiles/karpenter",
                "components/release-cilium-key",
                "components/strict-mode"
            ]
        );
    }

    /// The released taints the agent's policy allows to remove, read back
    /// from its CEL: `(key, value, effect)` of each exact-match clause.
    fn released_in_policy(text: &str) -> Vec<(String, String, String)> {
        let agent: serde_json::Value =
            serde_yaml::from_str(text.split("\n---\n").next().unwrap()).unwrap();
        let rule = agent["spec"]["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["expression"].as_str().unwrap())
            .find(|e| e.contains(".filter(t, "))
            .unwrap();
        let mut out = Vec::new();
        // Each clause: (t.key == 'K' && (has(t.value) ? t.value : '') == 'V' && t.effect == 'E')
        for part in rule.split("(t.key == '").skip(1) {
            let Some((key, rest)) = part.split_once("' && (has(t.value) ? t.value : '') == '")
            else {
                continue;
            };
            let (value, rest) = rest.split_once("' && t.effect == '").unwrap();
            let effect = rest.split_once('\'').unwrap().0;
            let t = (key.into(), value.into(), effect.into());
            // A stand-in is named in the rule beside its release.
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out.sort();
        out
    }

    /// For each configuration nodegate ships, the policy lets the agent
    /// remove exactly the taints that configuration's agent releases (the
    /// same shared function), and every shipped gate is either held or
    /// released: no switch leaves one behind.
    #[test]
    fn each_configurations_policy_allows_exactly_what_its_agent_releases() {
        use nodegate_shared::keys::{
            KARPENTER_PROFILE_TAINT, LEGACY_TAINT, MANAGED_CA_PROFILE_TAINT,
        };
        use nodegate_shared::taint::shipped_gates;
        const BOOT: &str = "nodegate.dev/agent-not-ready=true:NoExecute";
        let configurations: &[(&str, &[String])] = &[
            ("default", &[]),
            (
                "cluster-autoscaler",
                &[
                    format!("--taint={MANAGED_CA_PROFILE_TAINT}"),
                    format!("--release-taint={DEFAULT_TAINT}"),
                ],
            ),
            (
                "karpenter",
                &[
                    format!("--taint={KARPENTER_PROFILE_TAINT}"),
                    format!("--release-taint={DEFAULT_TAINT}"),
                ],
            ),
            ("strict-mode", &[format!("--boot-taint={BOOT}")]),
            (
                "release-cilium-key",
                &[format!("--release-taint={LEGACY_TAINT}")],
            ),
        ];
        for (name, flags) in configurations {
            let mut argv = vec!["x", "confinement"];
            argv.extend(flags.iter().map(String::as_str));
            let Command::Confinement(c) = Cli::try_parse_from(&argv).unwrap().command else {
                unreachable!()
            };
            let agent_releases = c.release.effective(&c.gate);
            let allowed = released_in_policy(&Command::Confinement(c.clone()).render().unwrap());
            let mut want: Vec<(String, String, String)> = agent_releases
                .iter()
                .map(|t| {
                    (
                        t.key().to_owned(),
                        t.value().unwrap_or("").to_owned(),
                        t.effect().to_string(),
                    )
                })
                .collect();
            want.sort();
            assert_eq!(allowed, want, "{name}");
            let held = c.gate.all();
            for gate in shipped_gates() {
                assert!(
                    held.contains(&gate) ^ agent_releases.contains(&gate),
                    "{name}: {gate} is neither held nor released, or both"
                );
            }
            assert_eq!(
                agent_releases.iter().any(|r| r.to_string() == LEGACY_TAINT),
                *name == "release-cilium-key",
                "{name}: Cilium's key is released only on request"
            );
        }
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

    const EBS: &str = "ebs.csi.aws.com/agent-not-ready:NoExecute";

    /// `--owned-taint` reaches every renderer the webhook's flags reach, and
    /// is refused where it repeats a taint of the webhook's, a gate nodegate
    /// ships, or a taint the agent releases (the agent never touches it).
    #[test]
    fn owned_taints_reach_every_renderer_and_contradictions_are_refused() {
        let taint: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
        let owned: Vec<TaintSpec> = vec![EBS.parse().unwrap()];
        let flag = format!("--owned-taint={EBS}");
        assert_eq!(
            render(&["policy", &flag]).unwrap(),
            policy::render_owned(&taint, &[], &owned, policy::ApiVersion::V1)
        );
        assert_eq!(
            render(&["webhook-config", &flag, "--replicas", "3"]).unwrap(),
            webhook_config::render_owned(&taint, &[], &owned, 3)
        );
        assert_eq!(
            render(&["confinement", &flag]).unwrap(),
            confinement::render_owned(&taint, &[], &owned, &[])
        );
        for command in ["policy", "webhook-config", "confinement"] {
            let text = render(&[command, &flag]).unwrap();
            assert!(
                text.starts_with(&format!(
                    "# Generated by `nodegate-webhook {command} --taint={DEFAULT_TAINT} {flag}"
                )),
                "{command}: the header names the flag"
            );
            for (bad, want) in [
                (
                    vec![
                        "--taint=example.com/x:NoSchedule",
                        "--owned-taint=example.com/x=y:NoSchedule",
                    ],
                    "listed twice",
                ),
                (
                    vec!["--owned-taint=nodegate.dev/agent-not-ready=true:NoExecute"],
                    "a gate nodegate ships",
                ),
            ] {
                let mut args = vec![command];
                args.extend(bad);
                let err = render(&args).unwrap_err().to_string();
                assert!(err.contains(want), "{command} {args:?}: {err}");
            }
        }
        let err = render(&["confinement", &flag, &format!("--release-taint={EBS}")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("key and effect of a managed taint"), "{err}");
    }

    /// `gates-component` writes the component's files and says which; a
    /// declaration that cannot work writes nothing.
    #[test]
    fn gates_component_writes_the_directory_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let decl = dir.path().join("in.yaml");
        std::fs::write(
            &decl,
            format!(
                "gates:\n  - {{name: cni, taint: '{DEFAULT_TAINT}', probes: {{tcp: ['127.0.0.1:1']}}}}\n  - {{name: ebs, taint: '{EBS}', owner: {{daemonSet: kube-system/ebs-csi-node}}}}\n"
            ),
        )
        .unwrap();
        let out = dir.path().join("component");
        let said = render(&[
            "gates-component",
            "--gates",
            decl.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .unwrap();
        let mut written: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        written.sort();
        assert_eq!(
            written,
            [
                "admission-policy.yaml",
                "confinement.yaml",
                "gates.yaml",
                "kustomization.yaml",
                "webhook-config.yaml"
            ]
        );
        assert_eq!(said.lines().count(), 5, "{said}");
        std::fs::write(&decl, "gates: [{name: a, taint: 'a.dev/x:NoSchedule'}]\n").unwrap();
        let empty = dir.path().join("never");
        let err = render(&[
            "gates-component",
            "--gates",
            decl.to_str().unwrap(),
            "--out",
            empty.to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("nothing would ever open it"),
            "{err:#}"
        );
        assert!(!empty.exists());
    }
}
