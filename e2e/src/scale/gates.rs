//! Several gates in one install (`--gates N`): nodegate's own gate
//! (`nodegate.dev/agent-not-ready`, the network agent's) and up to two more
//! of nodegate's, `nodegate.dev/csi-not-ready` and
//! `nodegate.dev/gpu-not-ready`, each `=true:NoSchedule` and each opened by
//! its own stand-in's readiness file.
//!
//! The install is the shipped one with what a gates install changes: the
//! webhook's StatefulSet with one `--taint` per gate, the confinement and
//! the webhook configuration rendered by `nodegate-webhook confinement` and
//! `nodegate-webhook webhook-config` for those taints, and the agent's
//! DaemonSet with `--gates` (the declaration, docs/gates.md) in place of
//! `--taint` and `--probe-*`. The first gate keeps the shipped probes; each
//! other gate is opened by a file in the same directory as the CNI config
//! (per node, [`super::fleet::agent_argv`] moves them into the node's own).

use anyhow::Context;
use nodegate_shared::gates::{Gate, Gates, Probes, Taint};
use serde_json::Value;

use super::install::{Variant, shipped_args};
use crate::manifests::by_kind_and_name;
use crate::process::manifests_dir;

/// The gates of an install, in order: name, taint, and the readiness file of
/// its stand-in (the first gate's is the network agent's CNI config).
pub const GATES: [(&str, &str, &str); 3] = [
    (
        "cni",
        nodegate_shared::keys::DEFAULT_TAINT,
        "05-cilium.conflist",
    ),
    (
        "csi",
        "nodegate.dev/csi-not-ready=true:NoSchedule",
        "csi.ready",
    ),
    (
        "gpu",
        "nodegate.dev/gpu-not-ready=true:NoSchedule",
        "gpu.ready",
    ),
];

/// The most gates the harness installs.
pub const MAX: usize = GATES.len();

/// Where the shipped DaemonSet mounts the host's CNI config directory.
const CNI_DIR: &str = "/host/etc/cni/net.d";

/// A taint's key (`key[=value]:Effect`).
pub fn key(taint: &str) -> &str {
    let end = taint.find(['=', ':']).unwrap_or(taint.len());
    &taint[..end]
}

/// The keys of the first `n` gates.
pub fn keys(n: usize) -> Vec<&'static str> {
    GATES.iter().take(n).map(|(_, t, _)| key(t)).collect()
}

/// The readiness files of gates 1.. (the stand-ins besides the network
/// agent), by file name, in gate order.
pub fn extra_files(n: usize) -> Vec<String> {
    GATES
        .iter()
        .take(n)
        .skip(1)
        .map(|(_, _, f)| f.to_string())
        .collect()
}

/// The declaration of the first `n` gates: the first with the shipped
/// DaemonSet's probes (`--probe-*`), each other with its stand-in's file.
pub fn declaration(n: usize) -> anyhow::Result<Gates> {
    anyhow::ensure!((1..=MAX).contains(&n), "--gates is 1 to {MAX}");
    let shipped = shipped_args("agent/daemonset.yaml")?;
    let flag = |name: &str| -> Vec<String> {
        shipped
            .iter()
            .filter_map(|a| a.strip_prefix(&format!("--probe-{name}=")))
            .map(str::to_string)
            .collect()
    };
    let mut gates = Vec::new();
    for (i, (name, taint, file)) in GATES.iter().take(n).enumerate() {
        let probes = if i == 0 {
            Probes {
                http: flag("http"),
                tcp: flag("tcp"),
                file: flag("file"),
                exec: flag("exec"),
                pod: flag("pod"),
            }
        } else {
            Probes {
                file: vec![format!("{CNI_DIR}/{file}")],
                ..Probes::default()
            }
        };
        gates.push(Gate {
            name: name.to_string(),
            taint: Taint(taint.parse()?),
            probes,
            owner: None,
        });
    }
    let gates = Gates {
        gates,
        boot_taints: Vec::new(),
    };
    gates.validate()?;
    Ok(gates)
}

/// The install of the first `n` gates (see the module's doc).
pub fn variant(n: usize) -> anyhow::Result<Variant> {
    let decl = declaration(n)?;
    let taints: Vec<String> = GATES
        .iter()
        .take(n)
        .map(|(_, t, _)| format!("--taint={t}"))
        .collect();
    let releases: Vec<String> = shipped_args("agent/daemonset.yaml")?
        .into_iter()
        .filter(|a| a.starts_with("--release-taint="))
        .collect();
    let mut confinement = vec!["confinement".to_string()];
    confinement.extend(taints.iter().cloned());
    confinement.extend(releases);
    let mut text = crate::process::webhook_output(&confinement)?;
    text.push_str("\n---\n");
    let mut config = vec!["webhook-config".to_string()];
    config.extend(taints.iter().cloned());
    config.push(format!("--replicas={}", crate::process::REPLICAS));
    text.push_str(&crate::process::webhook_output(&config)?);
    let mut objects = by_kind_and_name(&text)?;
    let gates_flag = format!("--gates={}", decl.to_flag());
    for file in ["webhook/statefulset.yaml", "agent/daemonset.yaml"] {
        let p = manifests_dir().join(file);
        let mut doc: Value = serde_yaml::from_str(&std::fs::read_to_string(&p)?)?;
        let args = doc
            .pointer_mut("/spec/template/spec/containers/0/args")
            .and_then(Value::as_array_mut)
            .with_context(|| format!("no container args in {}", p.display()))?;
        let old: Vec<String> = args
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let new = if file.starts_with("webhook/") {
            webhook_args(old, &taints)
        } else {
            agent_args(old, &gates_flag)
        };
        *args = new.into_iter().map(Value::String).collect();
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        objects.insert((kind, name), doc);
    }
    Ok(Variant { objects })
}

/// The StatefulSet's flags with one `--taint` per gate where its one was.
fn webhook_args(shipped: Vec<String>, taints: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for a in shipped {
        if a.starts_with("--taint=") {
            out.extend(taints.iter().cloned());
        } else {
            out.push(a);
        }
    }
    out
}

/// The DaemonSet's flags with `--gates` where `--taint` was, and no
/// `--probe-*` (the declaration carries each gate's probes).
fn agent_args(shipped: Vec<String>, gates: &str) -> Vec<String> {
    let mut out = Vec::new();
    for a in shipped {
        if a.starts_with("--taint=") {
            out.push(gates.to_string());
        } else if !a.starts_with("--probe-http=")
            && !a.starts_with("--probe-tcp=")
            && !a.starts_with("--probe-file=")
            && !a.starts_with("--probe-exec=")
            && !a.starts_with("--probe-pod=")
        {
            out.push(a);
        }
    }
    out
}

/// The agent DaemonSet's flags of a 3-gate install, without the webhook's
/// renderings ([`variant`] runs the binary).
#[cfg(test)]
pub(crate) fn variant_args_for_test() -> Vec<String> {
    let decl = declaration(MAX).unwrap_or_default();
    let shipped = shipped_args("agent/daemonset.yaml").unwrap_or_default();
    agent_args(shipped, &format!("--gates={}", decl.to_flag()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_keeps_the_shipped_probes_on_the_first_gate_and_a_file_on_each_other() {
        let d = declaration(3).unwrap();
        let names: Vec<&str> = d.gates.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["cni", "csi", "gpu"]);
        let shipped = shipped_args("agent/daemonset.yaml").unwrap();
        let first = &d.gates[0].probes;
        assert_eq!(
            first.len(),
            shipped
                .iter()
                .filter(|a| a.starts_with("--probe-"))
                .filter(|a| !a.starts_with("--probe-period") && !a.starts_with("--probe-timeout"))
                .count()
        );
        assert_eq!(d.gates[1].probes.file, [format!("{CNI_DIR}/csi.ready")]);
        assert_eq!(keys(3)[2], "nodegate.dev/gpu-not-ready");
        assert_eq!(extra_files(3), ["csi.ready", "gpu.ready"]);
        assert!(extra_files(1).is_empty());
        assert!(declaration(0).is_err() && declaration(MAX + 1).is_err());
        // What the agent parses back.
        assert_eq!(Gates::parse(&d.to_flag()).unwrap(), d);
    }

    #[test]
    fn each_workload_gets_every_gate_in_place_of_its_one_taint() {
        let taints = vec![
            "--taint=a.dev/x:NoSchedule".to_string(),
            "--taint=b.dev/y:NoSchedule".into(),
        ];
        let wh = webhook_args(shipped_args("webhook/statefulset.yaml").unwrap(), &taints);
        assert_eq!(wh.iter().filter(|a| a.starts_with("--taint=")).count(), 2);
        let ag = agent_args(shipped_args("agent/daemonset.yaml").unwrap(), "--gates={}");
        assert!(ag.iter().any(|a| a == "--gates={}"));
        assert!(!ag.iter().any(|a| a.starts_with("--taint=")
            || a.starts_with("--probe-file=")
            || a.starts_with("--probe-http=")));
        assert!(ag.iter().any(|a| a.starts_with("--probe-period=")));
    }
}
