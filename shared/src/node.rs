//! A slim view of a Node: only the fields nodegate's rules read.
//!
//! Decoding into this instead of a full typed `Node` skips images, conditions
//! and everything else in the (often 25 KB+) object; serde ignores the rest.
//! It is a `kube` resource (core `v1` `Node`), so kube's admission types and
//! `Api` decode straight into it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use kube_core::{ClusterResourceScope, ObjectMeta, Resource};
use serde::Deserialize;
use serde_json::Value;

use crate::keys::{EXCLUDE_LABEL, READY_BOOT_ID_ANNOTATION};
use crate::taint::TaintSpec;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "Fields")]
pub struct NodeView {
    pub metadata: MetaView,
    pub spec: Option<SpecView>,
    pub status: Option<StatusView>,
    /// Name, uid and resourceVersion as `kube::Resource::meta` hands them
    /// out (labels and annotations stay in `metadata` only).
    meta: ObjectMeta,
}

/// What is decoded; [`NodeView`] adds the `ObjectMeta` kube asks for.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fields {
    #[serde(default)]
    metadata: MetaView,
    #[serde(default)]
    spec: Option<SpecView>,
    #[serde(default)]
    status: Option<StatusView>,
}

impl From<Fields> for NodeView {
    fn from(f: Fields) -> Self {
        let meta = ObjectMeta {
            name: f.metadata.name.clone(),
            uid: f.metadata.uid.clone(),
            resource_version: f.metadata.resource_version.clone(),
            ..ObjectMeta::default()
        };
        Self {
            metadata: f.metadata,
            spec: f.spec,
            status: f.status,
            meta,
        }
    }
}

impl Resource for NodeView {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Node")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("nodes")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaView {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub resource_version: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SpecView {
    /// Kept as raw JSON so a `test` op can compare the exact stored entries.
    #[serde(default)]
    pub taints: Option<Vec<Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    #[serde(default)]
    pub node_info: Option<NodeInfoView>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfoView {
    #[serde(default, rename = "bootID")]
    pub boot_id: Option<String>,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl NodeView {
    pub fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    /// `nodegate.dev/exclude=true` opts a node out of everything.
    pub fn is_excluded(&self) -> bool {
        self.metadata.labels.get(EXCLUDE_LABEL).map(String::as_str) == Some("true")
    }

    /// The bootID the kubelet reports, if non-empty.
    pub fn boot_id(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .and_then(|i| i.boot_id.as_deref())
            .filter(|b| !b.is_empty())
    }

    /// The bootID the agent recorded when it removed the taint.
    pub fn ready_boot_id(&self) -> Option<&str> {
        self.metadata
            .annotations
            .get(READY_BOOT_ID_ANNOTATION)
            .map(String::as_str)
    }

    pub fn has_spec(&self) -> bool {
        self.spec.is_some()
    }

    /// The taints, or none when `spec` or `spec.taints` is absent.
    pub fn taints(&self) -> &[Value] {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
    }

    /// Configured taints this node does not carry (by key and effect).
    pub fn missing<'a>(&self, specs: &'a [TaintSpec]) -> Vec<&'a TaintSpec> {
        let taints = self.taints();
        specs.iter().filter(|s| !s.is_in(taints)).collect()
    }
}

/// The reboot rule: the agent recorded a ready bootID and the node now runs
/// another one, so the node rebooted since its agent was last ready.
pub fn rebooted_since_ready(ready_boot_id: Option<&str>, boot_id: Option<&str>) -> bool {
    matches!((ready_boot_id, boot_id), (Some(ready), Some(now)) if !now.is_empty() && ready != now)
}

/// A status write that replaces one non-empty bootID with another.
pub fn boot_id_changed(old: Option<&str>, new: Option<&str>) -> bool {
    matches!((old, new), (Some(o), Some(n)) if !o.is_empty() && !n.is_empty() && o != n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_only_what_rules_need() {
        let v: NodeView = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"nodegate.dev/exclude": "true"},
                         "annotations": {"nodegate.dev/ready-boot-id": "b1"}},
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
            "status": {"nodeInfo": {"bootID": "b2"}, "images": [{"names": ["x"]}]}
        }))
        .unwrap();
        assert_eq!(v.name(), Some("n1"));
        assert!(v.is_excluded());
        assert_eq!(v.ready_boot_id(), Some("b1"));
        assert_eq!(v.boot_id(), Some("b2"));
        assert_eq!(v.taints().len(), 1);
    }

    #[test]
    fn is_the_core_v1_node_resource() {
        assert_eq!(NodeView::url_path(&(), None), "/api/v1/nodes");
        let v: NodeView = serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7", "labels": {"a": "b"}},
        }))
        .unwrap();
        assert_eq!(v.meta().name.as_deref(), Some("n1"));
        assert_eq!(v.meta().uid.as_deref(), Some("u1"));
        assert_eq!(v.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(v.metadata.labels["a"], "b");
    }

    #[test]
    fn tolerates_absent_and_null_fields() {
        let v: NodeView =
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": null}})).unwrap();
        assert!(!v.has_spec());
        assert!(v.taints().is_empty());
        assert_eq!(v.boot_id(), None);
        let v: NodeView =
            serde_json::from_value(json!({"spec": {}, "status": {"nodeInfo": {"bootID": ""}}}))
                .unwrap();
        assert!(v.has_spec());
        assert_eq!(v.boot_id(), None);
    }

    #[test]
    fn missing_taints_by_key_and_effect() {
        let specs: Vec<TaintSpec> = vec![
            "a/x=true:NoSchedule".parse().unwrap(),
            "a/y:NoExecute".parse().unwrap(),
        ];
        let v: NodeView = serde_json::from_value(json!({
            "spec": {"taints": [{"key": "a/x", "value": "other", "effect": "NoSchedule"}]}
        }))
        .unwrap();
        let missing = v.missing(&specs);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].key(), "a/y");
    }

    #[test]
    fn reboot_rule() {
        assert!(rebooted_since_ready(Some("b1"), Some("b2")));
        assert!(!rebooted_since_ready(Some("b1"), Some("b1")));
        assert!(!rebooted_since_ready(None, Some("b2")));
        assert!(!rebooted_since_ready(Some("b1"), None));
        assert!(!rebooted_since_ready(Some("b1"), Some("")));
        assert!(boot_id_changed(Some("a"), Some("b")));
        assert!(!boot_id_changed(Some(""), Some("b")));
        assert!(!boot_id_changed(Some("a"), Some("a")));
        assert!(!boot_id_changed(None, Some("b")));
    }
}
