//! (a) The publisher's Lease and shards against a namespace editor.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_roster::shard::{self, DEFAULT_NAME};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::support::dry_run::{delete, patch_params, post};
use crate::support::editor::editor_rbac;
use crate::support::refusals::refused;
use crate::support::roster::{NS, WRITERS, config_map, lease};

/// A cluster with a namespace editor in `nodegate`: on the emulator its
/// RBAC is given at start (and the roster's policies installed, as the
/// pruning component does); on a real cluster it is created through the
/// RBAC API and deleted afterwards, or `None` where the API server has no
/// RBAC API.
async fn with_editor() -> (Cluster, Option<String>) {
    if std::env::var_os(nodegate_e2e::cluster::REAL_CLUSTER_ENV).is_none() {
        let c = Cluster::start_with_rbac(vec![editor_rbac("editor", NS)])
            .await
            .unwrap();
        c.emulator()
            .unwrap()
            .apply(&nodegate_e2e::process::shipped_roster_policy().unwrap())
            .unwrap();
        return (c, Some("editor".into()));
    }
    let c = Cluster::start().await.unwrap();
    let user = c.name("editor");
    let admin = c.client(users::ADMIN).await.unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&editor_rbac(&user, NS))
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    let role: Role = serde_json::from_value(docs[0].clone()).unwrap();
    match Api::<Role>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &role)
        .await
    {
        Ok(_) => c.delete_on_drop("roles", NS, &user),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            eprintln!("the API server serves no RBAC API: the editor's attacks are skipped");
            return (c, None);
        }
        Err(e) => panic!("granting the editor: {e}"),
    }
    let binding: RoleBinding = serde_json::from_value(docs[1].clone()).unwrap();
    Api::<RoleBinding>::namespaced(admin, NS)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    c.delete_on_drop("rolebindings", NS, &user);
    (c, Some(user))
}

/// The publisher's Lease as the admin reads it. On the emulator the
/// publisher's account creates it first (its own create is allowed); on a
/// real cluster the installed publisher holds it.
async fn publishers_lease(c: &Cluster) -> Lease {
    let admin: Api<Lease> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), NS);
    if let Some(l) = admin.get_opt(DEFAULT_NAME).await.unwrap() {
        return l;
    }
    assert!(
        !c.is_real(),
        "no Lease {NS}/{DEFAULT_NAME}: install the pruning component first"
    );
    let own: Api<Lease> = Api::namespaced(c.client(users::ROSTER).await.unwrap(), NS);
    own.create(&PostParams::default(), &lease(DEFAULT_NAME, "publisher-0"))
        .await
        .expect("the publisher creates its Lease")
}

/// (a) A namespace editor cannot take the publisher's leadership: updating
/// the Lease's holder (replace and patch), deleting it and creating it while
/// absent are refused with a 403 naming the editor; so is every write of a
/// shard. The editor's own ConfigMaps and Leases are untouched by the
/// policy. Threat: the holder decides whether and who publishes the roster
/// every pruning agent reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_editor_cannot_take_the_publishers_lease() {
    let (c, editor) = with_editor().await;
    let Some(editor) = editor else { return };
    let leases: Api<Lease> = Api::namespaced(c.client(&editor).await.unwrap(), NS);
    the_lease_is_not_the_editors(&c, &editor, &leases).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(&editor).await.unwrap(), NS);
    no_shard_is_the_editors(&c, &editor, &cms).await;

    // The policy is about the roster only.
    let own = c.name("editors-own");
    c.delete_on_drop("configmaps", NS, &own);
    c.delete_on_drop("leases", NS, &own);
    cms.create(&PostParams::default(), &config_map(&own, false))
        .await
        .expect("the editor's own ConfigMap");
    leases
        .create(&PostParams::default(), &lease(&own, &editor))
        .await
        .expect("the editor's own Lease");
}

/// The Lease: the editor can neither update its holder (replace and patch),
/// delete it, nor create it while absent.
async fn the_lease_is_not_the_editors(c: &Cluster, editor: &str, leases: &Api<Lease>) {
    let before = publishers_lease(c).await;
    let not_editor =
        format!("only the nodegate-roster ServiceAccount may write the roster Lease, not {editor}");

    // Reading is not refused: it is what RBAC grants, and the Lease is not secret.
    let mut taken = leases.get(DEFAULT_NAME).await.unwrap();
    let spec = taken.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(editor.to_string());
    spec.lease_duration_seconds = Some(3600);
    refused(
        "editor replaces the holder",
        leases.replace(DEFAULT_NAME, &post(c), &taken).await,
        &[
            WRITERS,
            &not_editor,
            &format!("(UPDATE lease {DEFAULT_NAME})"),
        ],
    );
    refused(
        "editor patches the holder",
        leases
            .patch(
                DEFAULT_NAME,
                &patch_params(c),
                &Patch::Merge(json!({"spec": {"holderIdentity": editor}})),
            )
            .await,
        &[WRITERS, &not_editor],
    );
    refused(
        "editor deletes the Lease",
        leases.delete(DEFAULT_NAME, &delete(c)).await,
        &[
            WRITERS,
            &not_editor,
            &format!("(DELETE lease {DEFAULT_NAME})"),
        ],
    );
    let admin: Api<Lease> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), NS);
    let after = admin.get(DEFAULT_NAME).await.unwrap();
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        before.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        "the holder is the publisher's"
    );

    // Absent (a publisher not started yet, or its Lease removed for repair):
    // the editor cannot be the one who creates it. On a real cluster the
    // installed Lease stays; the API server runs validating admission before
    // its storage answers AlreadyExists, so the dry run shows the same 403.
    if !c.is_real() {
        admin
            .delete(DEFAULT_NAME, &DeleteParams::default())
            .await
            .unwrap();
    }
    refused(
        "editor creates the Lease",
        leases.create(&post(c), &lease(DEFAULT_NAME, editor)).await,
        &[
            WRITERS,
            &not_editor,
            &format!("(CREATE lease {DEFAULT_NAME})"),
        ],
    );
    if !c.is_real() {
        assert!(admin.get_opt(DEFAULT_NAME).await.unwrap().is_none());
    }
}

/// Shards: the editor can neither rewrite, create (labelled, or by name
/// alone) nor delete one.
async fn no_shard_is_the_editors(c: &Cluster, editor: &str, cms: &Api<ConfigMap>) {
    let not_editor =
        format!("only the nodegate-roster ServiceAccount may write roster shards, not {editor}");
    let shard0 = shard::name_of(DEFAULT_NAME, 0);
    if !c.is_real() {
        Api::<ConfigMap>::namespaced(c.client(users::ROSTER).await.unwrap(), NS)
            .create(&PostParams::default(), &config_map(&shard0, true))
            .await
            .expect("the publisher creates a shard");
    }
    let mut poisoned = cms.get(&shard0).await.unwrap();
    poisoned.data = Some(BTreeMap::from([(
        shard::DATA_KEY.to_string(),
        r#"{"version":1,"epoch":18446744073709551615,"shard":0,"shards":1,"nodes":[]}"#.to_string(),
    )]));
    refused(
        "editor rewrites shard 0",
        cms.replace(&shard0, &post(c), &poisoned).await,
        &[
            WRITERS,
            &not_editor,
            &format!("(UPDATE configmap {shard0})"),
        ],
    );
    for (name, labelled) in [
        (shard::name_of(DEFAULT_NAME, 1023), true),
        (shard::name_of(DEFAULT_NAME, 7), false),
    ] {
        // On a real cluster shard 7 may exist: admission runs first all the same.
        refused(
            &format!("editor creates {name}"),
            cms.create(&post(c), &config_map(&name, labelled)).await,
            &[WRITERS, &not_editor],
        );
    }
    refused(
        "editor deletes shard 0",
        cms.delete(&shard0, &delete(c)).await,
        &[WRITERS, &not_editor],
    );
}
