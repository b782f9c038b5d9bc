//! Where the stand-in's settings come from: the `cilium-config` ConfigMap,
//! read through the API once at start (the operator reads the copy its
//! Deployment mounts).

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use super::OperatorConfig;

/// The settings in ConfigMap `namespace/name`; when it is absent, the
/// operator's own flag defaults (as an operator without that ConfigMap
/// runs), and `false` says so.
pub async fn read_config(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<(OperatorConfig, bool)> {
    let cms: Api<ConfigMap> = Api::namespaced(client, namespace);
    let found = cms
        .get_opt(name)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{name}"))?;
    let Some(cm) = found else {
        return Ok((OperatorConfig::default(), false));
    };
    let data: BTreeMap<String, String> = cm.data.unwrap_or_default();
    let config = OperatorConfig::from_configmap_data(&data)
        .with_context(|| format!("ConfigMap {namespace}/{name}"))?;
    Ok((config, true))
}
