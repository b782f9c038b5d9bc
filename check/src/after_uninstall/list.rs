//! The reads of `--after-uninstall`, and nothing else: every Node, every
//! object of each kind of [`KINDS`] (in nodegate's namespace for the
//! namespaced ones), and whether the namespace exists. Which of them are
//! nodegate's is the verdicts' decision.

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};

use super::Listed;
use super::objects::{KINDS, Kind, Object, Scope};

/// A list's error as text; a kind the API server does not serve (404: a
/// MutatingAdmissionPolicy before Kubernetes 1.34) holds nothing.
fn served<T>(r: Result<Vec<T>, kube::Error>) -> Result<Vec<T>, String> {
    match r {
        Ok(v) => Ok(v),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}

async fn objects(client: &Client, k: &Kind, namespace: &str) -> Result<Vec<Object>, String> {
    let gvk = GroupVersionKind::gvk(k.group, k.version, k.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, k.plural);
    let api: Api<DynamicObject> = match k.scope {
        Scope::Namespaced => Api::namespaced_with(client.clone(), namespace, &resource),
        Scope::Admission | Scope::Cluster | Scope::AnyNamespace => {
            Api::all_with(client.clone(), &resource)
        }
    };
    let listed = api.list(&ListParams::default()).await.map(|l| l.items);
    served(listed).map(|items| {
        items
            .iter()
            .map(|o| Object {
                name: o.name_any(),
                labels: o.labels().clone(),
                namespace: o.namespace(),
            })
            .collect()
    })
}

/// Everything [`super::verdict`] decides on.
pub async fn list(client: &Client, namespace: &str) -> Listed {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string());
    let mut listed = Vec::new();
    for k in KINDS {
        listed.push((k, objects(client, k, namespace).await));
    }
    let exists = Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
        .map(|n| n.is_some())
        .map_err(|e| e.to_string());
    Listed {
        nodes,
        objects: listed,
        namespace: exists,
    }
}
