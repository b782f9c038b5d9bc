//! Writes of a Node as a given client, answering the API server's refusal
//! as a value so the caller can look at it.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodegate_shared::keys::READY_BOOT_ID_ANNOTATION;
use serde_json::Value;

/// A merge patch.
pub async fn patch(
    client: &kube::Client,
    node: &str,
    body: Value,
) -> Result<Node, Box<kube::core::Status>> {
    let api: Api<Node> = Api::all(client.clone());
    match api
        .patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(n) => Ok(n),
        Err(kube::Error::Api(e)) => Err(e),
        Err(e) => panic!("{e}"),
    }
}

/// A JSON patch.
pub async fn json_patch(
    client: &kube::Client,
    node: &str,
    ops: Value,
) -> Result<Node, Box<kube::core::Status>> {
    json_patch_with(client, node, ops, &PatchParams::default()).await
}

pub async fn json_patch_with(
    client: &kube::Client,
    node: &str,
    ops: Value,
    pp: &PatchParams,
) -> Result<Node, Box<kube::core::Status>> {
    let api: Api<Node> = Api::all(client.clone());
    let p: json_patch::Patch = serde_json::from_value(ops).unwrap();
    match api.patch(node, pp, &Patch::<()>::Json(p)).await {
        Ok(n) => Ok(n),
        Err(kube::Error::Api(e)) => Err(e),
        Err(e) => panic!("{e}"),
    }
}

/// The JSON pointer of the agent's ready-boot annotation: one key, never
/// the whole map (replacing it would drop the annotations controllers add).
pub fn ready_boot_id_path() -> String {
    format!(
        "/metadata/annotations/{}",
        READY_BOOT_ID_ANNOTATION.replace('/', "~1")
    )
}
