//! What a read step hands its verdict: the object, its absence, or why it
//! could not be read. The verdict decides what each case means (a missing
//! Service fails, an unreadable one is skipped).

use std::fmt::Debug;
use std::fmt::Display;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Objects per page of a list that grows with the cluster (Nodes, a
/// DaemonSet's Pods, Events): at 5,000 nodes ten pages.
pub const PAGE: u32 = 500;

/// One object as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read<T> {
    Found(T),
    Missing,
    /// The read's error, as text.
    Unreadable(String),
}

impl<T> Read<T> {
    /// A `get_opt`'s result.
    pub fn of<E: Display>(got: Result<Option<T>, E>) -> Read<T> {
        match got {
            Ok(Some(t)) => Read::Found(t),
            Ok(None) => Read::Missing,
            Err(e) => Read::Unreadable(e.to_string()),
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Read<U> {
        match self {
            Read::Found(t) => Read::Found(f(t)),
            Read::Missing => Read::Missing,
            Read::Unreadable(e) => Read::Unreadable(e),
        }
    }
}

/// Every object of a cluster-scoped custom resource `r`, each spec parsed
/// by `parse` (or its name and why not); the list's own error as is.
pub async fn list_specs<T>(
    client: &Client,
    r: &ApiResource,
    parse: impl Fn(&str, &serde_json::Value) -> Result<T, String>,
) -> Result<Vec<Result<T, (String, String)>>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), r);
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|o| {
            let name = o.metadata.name.clone().unwrap_or_default();
            let spec = o
                .data
                .get("spec")
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            parse(&name, &spec).map_err(|e| (name, e))
        })
        .collect())
}

/// Every object `api` lists with `lp`, a page of [`PAGE`] at a time, each
/// kept as `keep` makes it (or dropped): a 5,000-node cluster is never held
/// whole.
pub async fn list_paged<K, T>(
    api: &Api<K>,
    lp: ListParams,
    mut keep: impl FnMut(K) -> Option<T>,
) -> Result<Vec<T>, kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let mut lp = lp.limit(PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        let next = page.metadata.continue_.clone();
        out.extend(page.items.into_iter().filter_map(&mut keep));
        match next {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

/// One Node as the checks that look at its taints read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTaints {
    pub name: String,
    /// `spec.taints`, as JSON.
    pub taints: Vec<Value>,
    /// `status.nodeInfo.bootID`.
    pub boot_id: Option<String>,
    /// The boot its agent recorded as ready (`nodegate.dev/ready-boot-id`).
    pub ready_boot_id: Option<String>,
}

impl NodeTaints {
    pub fn of(node: &Node) -> NodeTaints {
        NodeTaints {
            name: node.metadata.name.clone().unwrap_or_default(),
            taints: nodegate_shared::node::taints_json(node),
            boot_id: node
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.boot_id.clone()),
            ready_boot_id: node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(nodegate_shared::keys::READY_BOOT_ID_ANNOTATION))
                .cloned(),
        }
    }
}

/// Every Node: how many, and the ones with a taint (the others are only
/// counted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nodes {
    pub total: usize,
    pub tainted: Vec<NodeTaints>,
}

/// One paginated list of the Nodes, shared by the checks that count who
/// carries which taint.
pub async fn nodes(client: &Client) -> Result<Nodes, String> {
    let api: Api<Node> = Api::all(client.clone());
    let mut total = 0;
    let tainted = list_paged(&api, ListParams::default(), |n| {
        total += 1;
        let n = NodeTaints::of(&n);
        (!n.taints.is_empty()).then_some(n)
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(Nodes { total, tainted })
}

/// The API server does not serve the resource (no CRD).
pub fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_opt_reads_as_one_of_three() {
        assert_eq!(Read::of(Ok::<_, String>(Some(1))), Read::Found(1));
        assert_eq!(Read::of(Ok::<Option<i32>, String>(None)), Read::Missing);
        assert_eq!(
            Read::of(Err::<Option<i32>, _>("403")).map(|n| n + 1),
            Read::Unreadable("403".into())
        );
    }
}
