//! The shipped manifests as an operator builds them: `kubectl kustomize` of
//! an install base with components, keyed by kind and name.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::Context;
use serde_json::Value;

use crate::readme::repo_dir;

/// Objects by (kind, name).
pub type Objects = BTreeMap<(String, String), Value>;

/// `kubectl kustomize` of a kustomization that includes `base` (a path in the
/// repository, e.g. `manifests`) and `components` (names under
/// `manifests/components/`). The kustomization lives under `target/`, as
/// kustomize wants the repository at a relative path.
pub fn kustomize(base: &str, components: &[&str]) -> anyhow::Result<String> {
    kustomize_into(None, base, components)
}

/// [`kustomize`] with kustomize's `namespace: <namespace>`, as an operator
/// installs nodegate into a namespace of their own.
pub fn kustomize_in_namespace(
    namespace: &str,
    base: &str,
    components: &[&str],
) -> anyhow::Result<String> {
    kustomize_into(Some(namespace), base, components)
}

fn kustomize_into(
    namespace: Option<&str>,
    base: &str,
    components: &[&str],
) -> anyhow::Result<String> {
    let scratch = repo_dir().join("target");
    std::fs::create_dir_all(&scratch)?;
    let dir = tempfile::Builder::new()
        .prefix("kustomize-")
        .tempdir_in(&scratch)?;
    let mut k = format!("resources: [../../{base}]\n");
    if let Some(ns) = namespace {
        k.push_str(&format!("namespace: {ns}\n"));
    }
    if !components.is_empty() {
        k.push_str("components:\n");
        for c in components {
            k.push_str(&format!("  - ../../manifests/components/{c}\n"));
        }
    }
    std::fs::write(dir.path().join("kustomization.yaml"), k)?;
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir.path())
        .output()
        .context("kubectl kustomize")?;
    anyhow::ensure!(
        out.status.success(),
        "kustomize {base} {components:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The documents of a YAML stream by kind and name.
pub fn by_kind_and_name(text: &str) -> anyhow::Result<Objects> {
    let mut out = Objects::new();
    for v in nodegate_emulator::server::parse_documents(text)? {
        let field = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
        let (Some(kind), Some(name)) = (field("/kind"), field("/metadata/name")) else {
            anyhow::bail!("a document without kind or name: {v}");
        };
        out.insert((kind, name), v);
    }
    Ok(out)
}

/// `v` with every run of whitespace in its strings made one space:
/// kustomize re-folds multi-line scalars (a more-indented line gains a blank
/// line before it), which changes no CEL expression.
pub fn squeezed(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.split_whitespace().collect::<Vec<_>>().join(" ")),
        Value::Array(a) => Value::Array(a.iter().map(squeezed).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), squeezed(v))).collect())
        }
        other => other.clone(),
    }
}
