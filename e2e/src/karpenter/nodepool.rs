//! The NodePool fields the stand-in uses, read from the YAML of a real
//! `karpenter.sh/v1` NodePool (`pkg/apis/v1/nodepool.go`: `NodePoolSpec`,
//! `NodeClaimTemplate`, `ObjectMeta`, `NodeClaimTemplateSpec`), so the
//! same file can go to `kubectl apply` or to a check. Every other field
//! (requirements, nodeClassRef, expireAfter, disruption, limits, …) is
//! accepted and ignored. The emulator serves no Karpenter CRD, so NodePools
//! stay in the stand-in's memory.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

pub const API_VERSION: &str = "karpenter.sh/v1";
pub const KIND: &str = "NodePool";

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePool {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: NodePoolSpec,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    pub template: NodeClaimTemplate,
    /// Higher first when several NodePools fit a pod.
    #[serde(default)]
    pub weight: Option<i32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplate {
    #[serde(default)]
    pub metadata: TemplateMetadata,
    pub spec: NodeClaimTemplateSpec,
}

/// The template's `ObjectMeta`: labels and annotations only.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplateSpec {
    /// Taints every node of the pool carries; pods must tolerate them.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// Taints expected to be removed by someone else once the node starts.
    #[serde(default)]
    pub startup_taints: Vec<Taint>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a NodePool document: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("apiVersion {0:?}: the stand-in reads {API_VERSION}")]
    ApiVersion(String),
    #[error("kind {0:?}: expected {KIND}")]
    Kind(String),
    #[error("NodePool without metadata.name")]
    NoName,
}

impl NodePool {
    /// One YAML document.
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        let np: NodePool = serde_yaml::from_str(text)?;
        if np.api_version != API_VERSION {
            return Err(Error::ApiVersion(np.api_version));
        }
        if np.kind != KIND {
            return Err(Error::Kind(np.kind));
        }
        if np.name().is_empty() {
            return Err(Error::NoName);
        }
        Ok(np)
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// `weight`, 0 when unset.
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }

    pub fn startup_taints(&self) -> &[Taint] {
        &self.spec.template.spec.startup_taints
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: default
spec:
  template:
    metadata:
      labels:
        team: web
    spec:
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
      requirements:
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["on-demand"]
      startupTaints:
        - key: nodegate.dev/agent-not-ready
          value: "true"
          effect: NoSchedule
      expireAfter: 720h
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 1m
  limits:
    cpu: 1000
"#;

    #[test]
    fn reads_a_real_nodepool() {
        let np = NodePool::from_yaml(YAML).unwrap();
        assert_eq!(np.name(), "default");
        assert_eq!(np.weight(), 0);
        assert_eq!(np.spec.template.metadata.labels["team"], "web");
        assert!(np.spec.template.spec.taints.is_empty());
        let st = np.startup_taints();
        assert_eq!(st.len(), 1);
        assert_eq!(
            (
                st[0].key.as_str(),
                st[0].value.as_deref(),
                st[0].effect.as_str()
            ),
            ("nodegate.dev/agent-not-ready", Some("true"), "NoSchedule")
        );
    }

    #[test]
    fn refuses_other_objects() {
        let beta = YAML.replace("karpenter.sh/v1", "karpenter.sh/v1beta1");
        assert!(matches!(
            NodePool::from_yaml(&beta),
            Err(Error::ApiVersion(_))
        ));
        let claim = YAML.replace("kind: NodePool", "kind: NodeClaim");
        assert!(matches!(NodePool::from_yaml(&claim), Err(Error::Kind(_))));
        let unnamed = YAML.replace("  name: default\nspec", "  labels: {}\nspec");
        assert!(matches!(NodePool::from_yaml(&unnamed), Err(Error::NoName)));
        assert!(NodePool::from_yaml("- not a map").is_err());
    }
}
