//! The record kept per node, projected from the shared Node view.
//!
//! At 10,000 nodes a full `Node` (images, conditions, managed fields) costs
//! tens of KB each; watches decode into [`NodeResource`] (the shared view),
//! so serde skips the rest of the object and it is never held in memory.

use std::collections::BTreeMap;
use std::net::IpAddr;

pub use nodegate_shared::NodeAddress;
#[cfg(doc)]
use nodegate_shared::NodeResource;
use nodegate_shared::NodeView;
use serde::{Deserialize, Serialize};

/// What a deletion handler needs to clean up after a node: enough to find
/// routes, IPsec states or node IDs derived from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(default, rename = "bootID", skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl NodeRecord {
    /// The record as the roster carries it: labels and boot ID dropped, so
    /// only a join, a leave or a change of addresses, podCIDRs or providerID
    /// rewrites a shard (labels and reboots are frequent, and a deletion
    /// handler cleans up by name, uid, IPs and CIDRs).
    pub fn for_roster(mut self) -> Self {
        self.labels.clear();
        self.boot_id = None;
        self
    }

    /// The node's IP addresses (hostnames and DNS names left out), in order.
    pub fn ips(&self) -> Vec<&str> {
        self.addresses
            .iter()
            .filter(|a| a.address.parse::<IpAddr>().is_ok())
            .map(|a| a.address.as_str())
            .collect()
    }
}

impl NodeRecord {
    /// The record of a Node, or `None` for an object without name or uid
    /// (never sent by a real API server; nothing could be matched on it).
    pub fn from_view(view: &NodeView) -> Option<Self> {
        Some(Self {
            name: view.metadata.name.clone()?,
            uid: view.metadata.uid.clone()?,
            addresses: view.addresses().to_vec(),
            pod_cidrs: view.pod_cidrs(),
            provider_id: view.provider_id().map(str::to_owned),
            boot_id: view.boot_id().map(str::to_owned),
            labels: view.metadata.labels.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn projects_only_the_record_fields() {
        let node: NodeView = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7",
                         "labels": {"a": "b"}, "annotations": {"big": "x"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.1.0/24", "fd00::/64"],
                     "providerID": "aws:///i-1", "taints": []},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.1.0.5"},
                                      {"type": "Hostname", "address": "n1"}],
                       "nodeInfo": {"bootID": "b1", "kernelVersion": "6"},
                       "images": [{"names": ["x"], "sizeBytes": 1}]}
        }))
        .unwrap();
        let r = NodeRecord::from_view(&node).unwrap();
        assert_eq!(r.name, "n1");
        assert_eq!(r.pod_cidrs, vec!["10.0.1.0/24", "fd00::/64"]);
        assert_eq!(r.provider_id.as_deref(), Some("aws:///i-1"));
        assert_eq!(r.boot_id.as_deref(), Some("b1"));
        assert_eq!(r.ips(), vec!["10.1.0.5"]);
        assert_eq!(r.labels.get("a").map(String::as_str), Some("b"));
    }

    #[test]
    fn tolerates_missing_and_null_parts() {
        let node: NodeView = serde_json::from_value(
            json!({"metadata": {"name": "n", "uid": "u", "labels": null}, "spec": null}),
        )
        .unwrap();
        let r = NodeRecord::from_view(&node).unwrap();
        assert!(r.addresses.is_empty() && r.pod_cidrs.is_empty() && r.labels.is_empty());
        let nameless: NodeView = serde_json::from_value(json!({"metadata": {}})).unwrap();
        assert!(NodeRecord::from_view(&nameless).is_none());
    }
}
