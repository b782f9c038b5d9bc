//! The slim projection of a Node the pruner keeps, and the watch type that
//! decodes only those fields.
//!
//! At 10,000 nodes a full `Node` (images, conditions, managed fields) costs
//! tens of KB each; decoding straight into [`SlimNode`] means the rest of
//! the object is skipped by serde and never held in memory.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize};

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

/// One entry of `status.addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddress {
    #[serde(rename = "type")]
    pub kind: String,
    pub address: String,
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

/// A Node as the pruner's watcher decodes it: metadata trimmed to name, uid,
/// resourceVersion and labels; spec and status to the record's fields.
#[derive(Debug, Clone, Deserialize)]
pub struct SlimNode {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<SlimSpec>,
    #[serde(default)]
    status: Option<SlimStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SlimSpec {
    #[serde(default, rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(default, rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
    #[serde(default, rename = "providerID")]
    provider_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SlimStatus {
    #[serde(default)]
    addresses: Option<Vec<NodeAddress>>,
    #[serde(default, rename = "nodeInfo")]
    node_info: Option<SlimNodeInfo>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SlimNodeInfo {
    #[serde(default, rename = "bootID")]
    boot_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Option::<MetaFields>::deserialize(d)?;
    Ok(m.map(|m| ObjectMeta {
        name: m.name,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        ..ObjectMeta::default()
    })
    .unwrap_or_default())
}

impl k8s_openapi::Resource for SlimNode {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for SlimNode {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl SlimNode {
    pub fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    /// The record to keep, or `None` for an object without name or uid
    /// (never sent by a real API server; nothing could be matched on it).
    pub fn into_record(self) -> Option<NodeRecord> {
        let name = self.metadata.name?;
        let uid = self.metadata.uid?;
        let spec = self.spec.unwrap_or_default();
        let status = self.status.unwrap_or_default();
        let pod_cidrs = match (spec.pod_cidrs, spec.pod_cidr) {
            (Some(v), _) if !v.is_empty() => v,
            (_, Some(c)) if !c.is_empty() => vec![c],
            _ => Vec::new(),
        };
        Some(NodeRecord {
            name,
            uid,
            addresses: status.addresses.unwrap_or_default(),
            pod_cidrs,
            provider_id: spec.provider_id.filter(|p| !p.is_empty()),
            boot_id: status
                .node_info
                .and_then(|i| i.boot_id)
                .filter(|b| !b.is_empty()),
            labels: self.metadata.labels.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn projects_only_the_record_fields() {
        let node: SlimNode = serde_json::from_value(json!({
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
        assert!(node.metadata.annotations.is_none());
        assert!(node.metadata.managed_fields.is_none());
        let r = node.into_record().unwrap();
        assert_eq!(r.name, "n1");
        assert_eq!(r.pod_cidrs, vec!["10.0.1.0/24", "fd00::/64"]);
        assert_eq!(r.provider_id.as_deref(), Some("aws:///i-1"));
        assert_eq!(r.boot_id.as_deref(), Some("b1"));
        assert_eq!(r.ips(), vec!["10.1.0.5"]);
        assert_eq!(r.labels.get("a").map(String::as_str), Some("b"));
    }

    #[test]
    fn tolerates_missing_and_null_parts() {
        let node: SlimNode = serde_json::from_value(
            json!({"metadata": {"name": "n", "uid": "u", "labels": null}, "spec": null}),
        )
        .unwrap();
        let r = node.into_record().unwrap();
        assert!(r.addresses.is_empty() && r.pod_cidrs.is_empty() && r.labels.is_empty());
        let nameless: SlimNode = serde_json::from_value(json!({"metadata": {}})).unwrap();
        assert!(nameless.into_record().is_none());
    }
}
