//! (c) The publisher's own token, stolen: it writes nothing but its shards
//! and its Lease.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_roster::shard::DEFAULT_NAME;
use serde_json::json;

use crate::support::dry_run::{delete, patch_params, post};
use crate::support::refusals::refused;
use crate::support::roster::{NS, config_map, lease};

const CONFINEMENT: &str = "ValidatingAdmissionPolicy 'nodegate-roster-confinement'";

/// (c) The publisher's own token, stolen, writes nothing but its shards and
/// its Lease: another ConfigMap or Lease of the namespace cannot be read by
/// name, updated, patched or deleted (RBAC names only the roster's), nor
/// can a new one be planted (RBAC cannot name a create; the confinement
/// policy refuses it). Its own Lease cannot be deleted. What RBAC cannot
/// name: it lists every ConfigMap of the namespace, as the agents do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roster_token_writes_nothing_but_its_shards_and_lease() {
    let c = Cluster::start().await.unwrap();
    if let Some(emu) = c.emulator() {
        emu.apply(&nodegate_e2e::process::shipped_roster_policy().unwrap())
            .unwrap();
    }
    let admin = c.client(users::ADMIN).await.unwrap();
    let other = c.name("other-config");
    c.delete_on_drop("configmaps", NS, &other);
    c.delete_on_drop("leases", NS, &other);
    Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &config_map(&other, false))
        .await
        .unwrap();
    Api::<Lease>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &lease(&other, "someone"))
        .await
        .unwrap();

    let own = c.client(users::ROSTER).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(own.clone(), NS);
    let leases: Api<Lease> = Api::namespaced(own, NS);
    let user = format!("User \"{}\" cannot", users::ROSTER);
    refused(
        "get another ConfigMap",
        cms.get(&other).await,
        &[&user, "get resource \"configmaps\""],
    );
    let mut cm = config_map(&other, false);
    cm.data = Some(BTreeMap::from([("poison".to_string(), "1".to_string())]));
    refused(
        "update another ConfigMap",
        cms.replace(&other, &post(&c), &cm).await,
        &[&user, "update resource \"configmaps\""],
    );
    refused(
        "patch another ConfigMap",
        cms.patch(
            &other,
            &patch_params(&c),
            &Patch::Merge(json!({"data": {"poison": "1"}})),
        )
        .await,
        &[&user, "patch resource \"configmaps\""],
    );
    refused(
        "delete another ConfigMap",
        cms.delete(&other, &delete(&c)).await,
        &[&user, "delete resource \"configmaps\""],
    );
    refused(
        "update another Lease",
        leases
            .replace(&other, &post(&c), &lease(&other, "roster"))
            .await,
        &[&user, "update resource \"leases\""],
    );
    refused(
        "delete another Lease",
        leases.delete(&other, &delete(&c)).await,
        &[&user, "delete resource \"leases\""],
    );
    // Its own Lease: renewed and taken over by update, never deleted.
    refused(
        "delete its own Lease",
        leases.delete(DEFAULT_NAME, &delete(&c)).await,
        &[&user, "delete resource \"leases\""],
    );
    // Planting: a ConfigMap or Lease another component would read or elect on.
    let planted = c.name("planted");
    c.delete_on_drop("configmaps", NS, &planted);
    c.delete_on_drop("leases", NS, &planted);
    refused(
        "plant a ConfigMap",
        cms.create(&post(&c), &config_map(&planted, false)).await,
        &[
            CONFINEMENT,
            &format!(
                "nodegate-roster may write only its shards (ConfigMaps nodegate-roster-*) and its Lease nodegate-roster, not configmap {planted} (CREATE)"
            ),
        ],
    );
    refused(
        "plant a Lease",
        leases.create(&post(&c), &lease(&planted, "roster")).await,
        &[CONFINEMENT, &format!("not lease {planted} (CREATE)")],
    );
    // The exposure RBAC cannot close: list is namespace-wide.
    let listed = cms.list(&ListParams::default()).await.unwrap();
    assert!(
        listed
            .items
            .iter()
            .any(|cm| cm.metadata.name.as_deref() == Some(other.as_str())),
        "list reads every ConfigMap of the namespace"
    );
}
