//! The taint key profiles: the same gate under three keys, each with the
//! install that names it everywhere (the webhook's and the agent's
//! `--taint`, the confinement policies, the webhook configuration's
//! conditions).

use anyhow::Context;
use serde_json::Value;

use crate::manifests::{by_kind_and_name, kustomize};
use crate::process::manifests_dir;
use crate::scale::install::{Variant, shipped_args};

/// One key profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Its name in figures.
    pub name: &'static str,
    /// Its component's directory under `manifests/components/key-profiles/`.
    pub component: &'static str,
    /// The taint, `key=value:Effect`.
    pub taint: &'static str,
}

/// nodegate's own key: CA needs `--startup-taint` for it.
pub const DEFAULT: Profile = Profile {
    name: "default",
    component: "default",
    taint: nodegate_shared::keys::DEFAULT_TAINT,
};

/// A key under CA's startup prefix: a startup taint to CA without a flag,
/// the only kind a managed CA (GKE, AKS) takes.
pub const MANAGED_CA: Profile = Profile {
    name: "managed-ca",
    component: "cluster-autoscaler",
    taint: nodegate_shared::keys::MANAGED_CA_PROFILE_TAINT,
};

/// A key under Node Readiness Controller's domain, which Karpenter knows as
/// ephemeral; CA needs `--startup-taint` for it.
pub const KARPENTER: Profile = Profile {
    name: "karpenter",
    component: "karpenter",
    taint: nodegate_shared::keys::KARPENTER_PROFILE_TAINT,
};

impl Profile {
    /// The taint's key.
    pub fn key(&self) -> &'static str {
        let end = self.taint.find(['=', ':']).unwrap_or(self.taint.len());
        &self.taint[..end]
    }

    /// CA treats the key as a startup taint with no flag.
    pub fn startup_by_prefix(&self) -> bool {
        self.key()
            .starts_with("startup-taint.cluster-autoscaler.kubernetes.io/")
    }

    /// The install of this profile: the shipped one for the default key;
    /// else the component `manifests/components/key-profiles/<component>/` built
    /// with the base when it exists, and until then what it will hold: the
    /// webhook's generators run with this `--taint`, and the shipped
    /// DaemonSet and StatefulSet with their `--taint` replaced. The one
    /// place that knows where a profile's install comes from.
    pub fn variant(&self) -> anyhow::Result<(Variant, &'static str)> {
        if *self == DEFAULT {
            return Ok((Variant::default(), "shipped"));
        }
        let component = format!("key-profiles/{}", self.component);
        if manifests_dir()
            .join("../components")
            .join(&component)
            .join("kustomization.yaml")
            .exists()
        {
            let objects = by_kind_and_name(&kustomize("manifests", &[&component])?)?;
            return Ok((Variant { objects }, "component"));
        }
        Ok((self.generated()?, "generated"))
    }

    fn generated(&self) -> anyhow::Result<Variant> {
        let taint = format!("--taint={}", self.taint);
        let releases: Vec<String> = shipped_args("agent/daemonset.yaml")?
            .into_iter()
            .filter(|a| a.starts_with("--release-taint="))
            .collect();
        let mut confinement = vec!["confinement".to_string(), taint.clone()];
        confinement.extend(releases);
        let mut text = crate::process::webhook_output(&confinement)?;
        text.push_str("\n---\n");
        text.push_str(&crate::process::webhook_output(&[
            "webhook-config".into(),
            taint.clone(),
            format!("--replicas={}", crate::process::REPLICAS),
        ])?);
        let mut objects = by_kind_and_name(&text)?;
        for file in ["agent/daemonset.yaml", "webhook/statefulset.yaml"] {
            let p = manifests_dir().join(file);
            let mut doc: Value = serde_yaml::from_str(&std::fs::read_to_string(&p)?)?;
            let args = doc
                .pointer_mut("/spec/template/spec/containers/0/args")
                .and_then(Value::as_array_mut)
                .with_context(|| format!("no container args in {}", p.display()))?;
            for a in args.iter_mut() {
                if a.as_str().is_some_and(|s| s.starts_with("--taint=")) {
                    *a = Value::String(taint.clone());
                }
            }
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            objects.insert((kind, name), doc);
        }
        Ok(Variant { objects })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(DEFAULT.key(), "nodegate.dev/agent-not-ready");
        assert!(MANAGED_CA.startup_by_prefix());
        assert!(!KARPENTER.startup_by_prefix());
        assert_eq!(KARPENTER.key(), "readiness.k8s.io/nodegate-agent-not-ready");
    }

    /// The generated install names the profile's key everywhere (needs
    /// `nodegate-webhook` built; skipped without it).
    #[test]
    fn a_generated_install_names_the_key_everywhere() {
        if !crate::process::bin_path("nodegate-webhook").exists() {
            println!("skipped: nodegate-webhook not built");
            return;
        }
        let v = KARPENTER.generated().expect("generated");
        let taint = format!("--taint={}", KARPENTER.taint);
        for file in ["agent/daemonset.yaml", "webhook/statefulset.yaml"] {
            let args = v.args(file).expect("args");
            assert!(args.contains(&taint), "{file}: {args:?}");
            assert!(
                !args
                    .iter()
                    .any(|a| a.contains("nodegate.dev/agent-not-ready")),
                "{args:?}"
            );
        }
        let text = |kind: &str, name: &str| {
            v.objects
                .get(&(kind.to_string(), name.to_string()))
                .map(|o| o.to_string())
                .unwrap_or_default()
        };
        assert!(text("MutatingWebhookConfiguration", "nodegate").contains(KARPENTER.key()));
        assert!(
            v.objects
                .iter()
                .filter(|((k, _), _)| k == "ValidatingAdmissionPolicy")
                .any(|(_, o)| o.to_string().contains(KARPENTER.key()))
        );
    }
}
