//! The node roster's objects (the publisher's Lease, its shard
//! ConfigMaps): as a test makes them, and as it reads what a publisher
//! wrote.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use nodegate_roster::shard::{self, DEFAULT_NAME};
use serde_json::json;

/// The namespace of the shipped install.
pub const NS: &str = "nodegate";
pub const WRITERS: &str =
    "ValidatingAdmissionPolicy 'nodegate-roster-writers' with binding 'nodegate-roster-writers'";

pub fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }))
    .unwrap()
}

/// A ConfigMap named `name`, with the shard label if `labelled`.
pub fn config_map(name: &str, labelled: bool) -> ConfigMap {
    let mut cm = json!({"metadata": {"name": name}, "data": {shard::DATA_KEY: "{}"}});
    if labelled {
        cm["metadata"]["labels"] = json!({shard::LABEL: DEFAULT_NAME});
    }
    serde_json::from_value(cm).unwrap()
}

/// The shipped roster's shards in `ns` that decode: name → shard.
pub async fn shards(c: &kube::Client, ns: &str) -> BTreeMap<String, shard::Shard> {
    let lp = ListParams::default().labels(&shard::selector(DEFAULT_NAME));
    Api::<ConfigMap>::namespaced(c.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|cm| {
            let s = shard::decode(DEFAULT_NAME, cm).ok()?;
            Some((cm.metadata.name.clone()?, s))
        })
        .collect()
}

/// The newest epoch once every shard of it is written with `count` shards
/// and no other shard is left.
pub async fn published(c: &kube::Client, ns: &str, count: u32) -> Option<u64> {
    let found = shards(c, ns).await;
    let (epoch, n) = shard::complete_epoch(found.values())?;
    let names: BTreeSet<&String> = found.keys().collect();
    let want: BTreeSet<String> = (0..count)
        .map(|i| shard::name_of(DEFAULT_NAME, i))
        .collect();
    (n == count && names == want.iter().collect()).then_some(epoch)
}

/// The publisher's Lease in `ns`, if there is one.
pub async fn holder(c: &kube::Client, ns: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(c.clone(), ns)
        .get_opt(DEFAULT_NAME)
        .await
        .unwrap()
}

pub fn holder_of(l: &Lease) -> Option<&str> {
    l.spec.as_ref()?.holder_identity.as_deref()
}
