//! Creates every object of the given YAML files through the emulator's API
//! with `kubectl create`, as e2e/tests/manifests.rs does for the kustomize
//! renderings: the emulator's validation (CEL compiled as upstream compiles
//! it, structural rules, ConfigMap limits) sees each object. One fresh
//! emulator per file. `.ci/helm` runs it on every rendering of the chart.
//!
//!   nodegate-create-manifests FILE...
//!
//! Fails on a missing or empty file, an object the emulator refuses, a kind
//! that carries CEL and is not served, or a kind neither served nor in the
//! list of kinds validated elsewhere (kubernetes-validate, .ci/crd_schemas.py).

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context, bail, ensure};
use nodegate_emulator::{Emulator, EmulatorOptions, resources, users};
use serde::Deserialize;
use serde_json::Value;

/// Kinds the emulator does not serve: `.ci/helm` validates them against the
/// OpenAPI schemas (built-in kinds) or .ci/crd_schemas.py (custom resources).
const NOT_SERVED: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
    "Job",
    "Certificate",
    "Issuer",
    "PodMonitor",
    "PrometheusRule",
];

/// Kinds whose objects hold CEL: each must go through the emulator.
const CEL_KINDS: &[&str] = &[
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

async fn create_all(path: &str) -> anyhow::Result<(usize, BTreeSet<String>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let emu = Emulator::start(EmulatorOptions::default()).await?;
    let mut served = Vec::new();
    let mut skipped = BTreeSet::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc).with_context(|| format!("parsing {path}"))?;
        if v.is_null() {
            continue;
        }
        let av = v["apiVersion"].as_str().unwrap_or_default();
        let kind = v["kind"].as_str().unwrap_or_default();
        if resources::by_kind(av, kind).is_some() {
            served.push(serde_yaml::to_string(&v)?);
        } else {
            skipped.insert(kind.to_owned());
        }
    }
    ensure!(
        !served.is_empty(),
        "{path}: no object the emulator serves (an empty rendering?)"
    );
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), served.join("---\n"))?;
    let out = Command::new("kubectl")
        .env("KUBECONFIG", emu.kubeconfig(users::ADMIN)?)
        .args(["create", "-f"])
        .arg(file.path())
        .output()
        .context("running kubectl")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{path}: the emulator refused an object:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let created = stdout.lines().filter(|l| l.ends_with(" created")).count();
    ensure!(
        created == served.len(),
        "{path}: {created} of {} created:\n{stdout}",
        served.len()
    );
    Ok((created, skipped))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    ensure!(
        !files.is_empty(),
        "usage: nodegate-create-manifests FILE..."
    );
    for path in &files {
        let (created, skipped) = create_all(path).await?;
        for k in &skipped {
            ensure!(
                !CEL_KINDS.contains(&k.as_str()),
                "{path}: {k} carries CEL and must be served by the emulator"
            );
            ensure!(
                NOT_SERVED.contains(&k.as_str()),
                "{path}: kind {k} is neither served by the emulator nor validated elsewhere"
            );
        }
        println!("{path}: {created} objects created through the emulator; not served: {skipped:?}");
    }
    Ok(())
}
