//! [`SlimNode`]: a Node decoded only as far as nodegate's rules read it.
//!
//! kube's admission types and `Api` are generic over `kube::Resource`. Decoding
//! into a full `k8s_openapi` Node (or a `DynamicObject`) would allocate every
//! image name, condition and address of a 25 KB object on the hot path; this
//! newtype around [`NodeView`] lets serde skip all of that.

use std::borrow::Cow;

use kube::core::{ClusterResourceScope, ObjectMeta, Resource};
use nodegate_shared::NodeView;
use serde::{Deserialize, Deserializer};

/// A Node with only the fields the rules read (see [`NodeView`]).
///
/// `meta()` carries name, uid and resourceVersion only; labels and
/// annotations live in `view.metadata` and are not duplicated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlimNode {
    meta: ObjectMeta,
    pub view: NodeView,
}

impl SlimNode {
    pub fn new(view: NodeView) -> Self {
        let meta = ObjectMeta {
            name: view.metadata.name.clone(),
            uid: view.metadata.uid.clone(),
            resource_version: view.metadata.resource_version.clone(),
            ..ObjectMeta::default()
        };
        Self { meta, view }
    }
}

impl From<NodeView> for SlimNode {
    fn from(view: NodeView) -> Self {
        Self::new(view)
    }
}

impl<'de> Deserialize<'de> for SlimNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        NodeView::deserialize(d).map(SlimNode::new)
    }
}

impl Resource for SlimNode {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_url_is_the_core_nodes_path() {
        assert_eq!(SlimNode::url_path(&(), None), "/api/v1/nodes");
        let n: SlimNode = serde_json::from_str(
            r#"{"metadata":{"name":"n1","resourceVersion":"7","labels":{"a":"b"}},
                "status":{"images":[{"names":["x"],"sizeBytes":1}]}}"#,
        )
        .unwrap();
        assert_eq!(n.meta().name.as_deref(), Some("n1"));
        assert_eq!(n.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(n.view.metadata.labels["a"], "b");
    }
}
