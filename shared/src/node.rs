//! A slim view of a Node: only the fields nodegate reads (the webhook's and
//! the agent's rules, and the roster's record of each node).
//!
//! Decoding into this instead of a full typed `Node` skips images, conditions
//! and everything else in the (often 25 KB+) object; serde ignores the rest.
//! It is a kube resource (core `v1` `Node`), so kube's admission types and
//! `Api` decode straight into it; with the `kube` feature, [`NodeResource`]
//! does the same for kube-runtime's watcher.

use std::borrow::Cow;
use std::collections::BTreeMap;

use kube_core::{ClusterResourceScope, ObjectMeta, Resource};
use serde::{Deserialize, Serialize};
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
    #[serde(default, rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Option<Vec<String>>,
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    #[serde(default)]
    pub node_info: Option<NodeInfoView>,
    #[serde(default)]
    pub addresses: Option<Vec<NodeAddress>>,
}

/// One entry of `status.addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddress {
    #[serde(rename = "type")]
    pub kind: String,
    pub address: String,
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

    /// [`EXCLUDE_LABEL`]`=true` opts a node out of everything.
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

    /// The podCIDRs the node was given: `spec.podCIDRs`, or the older
    /// single `spec.podCIDR` when the list is absent or empty.
    pub fn pod_cidrs(&self) -> Vec<String> {
        let spec = self.spec.as_ref();
        match (
            spec.and_then(|s| s.pod_cidrs.as_ref()),
            spec.and_then(|s| s.pod_cidr.as_ref()),
        ) {
            (Some(v), _) if !v.is_empty() => v.clone(),
            (_, Some(c)) if !c.is_empty() => vec![c.clone()],
            _ => Vec::new(),
        }
    }

    /// The cloud provider's ID of the machine, if non-empty.
    pub fn provider_id(&self) -> Option<&str> {
        self.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty())
    }

    /// `status.addresses`, in order.
    pub fn addresses(&self) -> &[NodeAddress] {
        self.status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or(&[])
    }

    /// Configured taints this node does not carry (by key and effect).
    pub fn missing<'a>(&self, specs: &'a [TaintSpec]) -> Vec<&'a TaintSpec> {
        let taints = self.taints();
        specs.iter().filter(|s| !s.is_in(taints)).collect()
    }
}

/// A [`NodeView`] as a kube resource (`/api/v1/nodes`), so `Api` and the
/// watcher decode a Node straight into the view. `meta()` carries name, uid
/// and resourceVersion only; labels and annotations stay in
/// `view.metadata`.
#[cfg(feature = "kube")]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeResource {
    meta: kube::core::ObjectMeta,
    pub view: NodeView,
}

#[cfg(feature = "kube")]
impl From<NodeView> for NodeResource {
    fn from(view: NodeView) -> Self {
        let meta = kube::core::ObjectMeta {
            name: view.metadata.name.clone(),
            uid: view.metadata.uid.clone(),
            resource_version: view.metadata.resource_version.clone(),
            ..Default::default()
        };
        Self { meta, view }
    }
}

#[cfg(feature = "kube")]
impl<'de> Deserialize<'de> for NodeResource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        NodeView::deserialize(d).map(Self::from)
    }
}

#[cfg(feature = "kube")]
impl kube::core::Resource for NodeResource {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &kube::core::ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut kube::core::ObjectMeta {
        &mut self.meta
    }
}

/// A typed Node's taints as the API serves them (JSON objects, `[]` for
/// none): what a JSON patch's `test` op and an exact match compare.
pub fn taints_json(node: &k8s_openapi::api::core::v1::Node) -> Vec<Value> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect()
        })
        .unwrap_or_default()
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

/// `a` is an older version of the same object than `b`: both
/// resourceVersions compared as the API server's comparable form (decimal
/// digits without a leading zero, longer is newer, else lexically), as
/// apimachinery's `resourceversion.CompareResourceVersion` does. False when
/// either is absent or not in that form: an API server whose versions are
/// opaque strings loses only the shortcut.
pub fn older_version(a: Option<&str>, b: Option<&str>) -> bool {
    fn comparable(v: &str) -> bool {
        !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) && (v == "0" || !v.starts_with('0'))
    }
    match (a, b) {
        (Some(a), Some(b)) if comparable(a) && comparable(b) => (a.len(), a) < (b.len(), b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_only_what_rules_need() {
        let v: NodeView = serde_json::from_value(json!({
            "metadata": {"name": "n1",
                         "labels": {"node-restriction.kubernetes.io/nodegate-exclude": "true"},
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

    /// Only the label a kubelet cannot set on itself excludes, and only with
    /// `true`; the former `nodegate.dev/exclude` any kubelet could set.
    #[test]
    fn only_the_node_restricted_label_excludes() {
        let with = |labels: serde_json::Value| -> bool {
            serde_json::from_value::<NodeView>(
                json!({"metadata": {"name": "n1", "labels": labels}}),
            )
            .unwrap()
            .is_excluded()
        };
        assert!(with(
            json!({"node-restriction.kubernetes.io/nodegate-exclude": "true"})
        ));
        assert!(!with(
            json!({"node-restriction.kubernetes.io/nodegate-exclude": "false"})
        ));
        assert!(!with(json!({"nodegate.dev/exclude": "true"})));
        assert!(!with(json!({})));
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
    fn reads_what_the_roster_records() {
        let v: NodeView = serde_json::from_value(json!({
            "spec": {"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.1.0/24", "fd00::/64"],
                     "providerID": "aws:///i-1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.1.0.5"}]}
        }))
        .unwrap();
        assert_eq!(v.pod_cidrs(), vec!["10.0.1.0/24", "fd00::/64"]);
        assert_eq!(v.provider_id(), Some("aws:///i-1"));
        assert_eq!(v.addresses()[0].address, "10.1.0.5");
        // The older single podCIDR when the list is absent; empty is none.
        let v: NodeView = serde_json::from_value(
            json!({"spec": {"podCIDR": "10.0.2.0/24", "podCIDRs": [], "providerID": ""}}),
        )
        .unwrap();
        assert_eq!(v.pod_cidrs(), vec!["10.0.2.0/24"]);
        assert_eq!(v.provider_id(), None);
        assert!(v.addresses().is_empty());
    }

    #[cfg(feature = "kube")]
    #[test]
    fn resource_is_the_core_nodes_path_with_identity_in_meta() {
        use kube::core::Resource;
        assert_eq!(NodeResource::url_path(&(), None), "/api/v1/nodes");
        let n: NodeResource = serde_json::from_value(json!({
            "metadata": {"name": "n", "uid": "u", "resourceVersion": "3", "labels": {"a": "b"}}
        }))
        .unwrap();
        assert_eq!(n.meta().name.as_deref(), Some("n"));
        assert_eq!(n.meta().uid.as_deref(), Some("u"));
        assert_eq!(n.meta().resource_version.as_deref(), Some("3"));
        assert_eq!(
            n.view.metadata.labels.get("a").map(String::as_str),
            Some("b")
        );
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

    #[test]
    fn versions_compare_as_the_api_server_defines_them() {
        let cases = [
            (Some("9"), Some("10"), true),
            (Some("10"), Some("9"), false),
            (Some("41"), Some("41"), false),
            (Some("123"), Some("124"), true),
            (
                Some("18446744073709551616"),
                Some("18446744073709551617"),
                true,
            ),
            (Some("09"), Some("10"), false),
            (Some("a1"), Some("b2"), false),
            (None, Some("3"), false),
            (Some("3"), None, false),
            (Some(""), Some("3"), false),
        ];
        for (a, b, want) in cases {
            assert_eq!(older_version(a, b), want, "{a:?} < {b:?}");
        }
    }
}
