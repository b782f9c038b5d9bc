//! The NodeClaims the stand-in launches, kept in its memory (the emulator
//! serves no Karpenter CRD).
//!
//! Upstream: `pkg/apis/v1/nodeclaim.go`; `provisioning/scheduling/
//! nodeclaimtemplate.go` `NewNodeClaimTemplate` and `ToNodeClaim` (the
//! template's labels plus `karpenter.sh/nodepool`, its `taints` and
//! `startupTaints`, its annotations).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use super::nodepool::NodePool;

pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

#[derive(Debug, Clone, PartialEq)]
pub struct NodeClaim {
    pub name: String,
    pub nodepool: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `spec.taints`.
    pub taints: Vec<Taint>,
    /// `spec.startupTaints`.
    pub startup_taints: Vec<Taint>,
    /// `status.providerID`, from the cloud provider at launch.
    pub provider_id: String,
    /// The instance's capacity in pods: the stand-in's only resource.
    pub pod_slots: usize,
    /// The `Registered` condition is true.
    pub registered: bool,
    /// `status.nodeName`, set at registration.
    pub node_name: Option<String>,
    /// The `Initialized` condition is true.
    pub initialized: bool,
}

impl NodeClaim {
    /// `ToNodeClaim` of `np`'s template, as launched.
    pub fn from_nodepool(np: &NodePool, name: &str, provider_id: &str, pod_slots: usize) -> Self {
        let t = &np.spec.template;
        let mut labels = t.metadata.labels.clone();
        labels.insert(NODEPOOL_LABEL.to_string(), np.name().to_string());
        Self {
            name: name.to_string(),
            nodepool: np.name().to_string(),
            labels,
            annotations: t.metadata.annotations.clone(),
            taints: t.spec.taints.clone(),
            startup_taints: t.spec.startup_taints.clone(),
            provider_id: provider_id.to_string(),
            pod_slots,
            registered: false,
            node_name: None,
            initialized: false,
        }
    }
}
