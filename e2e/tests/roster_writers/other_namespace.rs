//! (d) The install moved to another namespace by kustomize: its roster is
//! still guarded there, and the same names elsewhere are anyone's.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use nodegate_e2e::LoggedChild;
use nodegate_emulator::{Emulator, EmulatorOptions, users};
use nodegate_roster::shard::{self, DEFAULT_NAME};
use serde_json::json;

use crate::support::editor::editor_rbac;
use crate::support::poll::eventually_some;
use crate::support::refusals::refused;
use crate::support::roster::{WRITERS, config_map, holder, holder_of, lease, published};
use crate::support::roster_publisher::{WAIT, assert_never_refused, publisher};

/// The namespace kustomize moves the install to.
const OTHER: &str = "platform-gates";
/// A namespace without nodegate.
const UNRELATED: &str = "team-a";
const LEASE_MSG: &str =
    "only the nodegate-roster ServiceAccount may write the roster Lease, not editor";

/// (d) Installed by kustomize under `namespace: platform-gates` (the Role
/// bindings, the Namespace and the workloads move; no CEL and no selector
/// is rewritten), the roster is still guarded: an editor there cannot take
/// the Lease or write a shard, the account the old policy named
/// (`nodegate:nodegate-roster`) has no rights there, and the real
/// publisher of that namespace's account leads and publishes. In a
/// namespace where nodegate is not installed (no `app.kubernetes.io/part-of:
/// nodegate` label) the same names are anyone's. Emulator only: it needs a
/// second install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_in_another_namespace_the_roster_is_still_guarded() {
    if std::env::var_os(nodegate_e2e::cluster::REAL_CLUSTER_ENV).is_some() {
        eprintln!("skipped on a real cluster: needs a second install in another namespace");
        return;
    }
    let emu = installed_in_another_namespace().await;
    let admin = emu.client(users::ADMIN).await.unwrap();
    let mut p = the_moved_publisher_publishes(&emu, &admin).await;
    let editor = emu.client("editor").await.unwrap();
    let leases: Api<Lease> = Api::namespaced(editor.clone(), OTHER);
    let taken = the_moved_roster_is_not_the_editors(&leases, &editor).await;
    // The account the old policy exempted by name has no rights here.
    let old = Api::<Lease>::namespaced(emu.client(users::ROSTER).await.unwrap(), OTHER);
    refused(
        "nodegate's publisher account writes the moved Lease",
        old.replace(DEFAULT_NAME, &PostParams::default(), &taken)
            .await,
        &[&format!(
            "User \"{}\" cannot update resource \"leases\"",
            users::ROSTER
        )],
    );
    // Deleted and absent: the editor cannot be the one who creates it.
    p.stop().await.unwrap();
    assert_never_refused(&p);
    Api::<Lease>::namespaced(admin.clone(), OTHER)
        .delete(DEFAULT_NAME, &DeleteParams::default())
        .await
        .unwrap();
    refused(
        "editor creates the moved Lease",
        leases
            .create(&PostParams::default(), &lease(DEFAULT_NAME, "editor"))
            .await,
        &[WRITERS, LEASE_MSG],
    );

    // Where nodegate is not installed, the names are nobody's.
    Api::<Lease>::namespaced(editor.clone(), UNRELATED)
        .create(&PostParams::default(), &lease(DEFAULT_NAME, "editor"))
        .await
        .expect("a Lease of that name in an unrelated namespace");
    let shard0 = shard::name_of(DEFAULT_NAME, 0);
    Api::<ConfigMap>::namespaced(editor, UNRELATED)
        .create(&PostParams::default(), &config_map(&shard0, true))
        .await
        .expect("a ConfigMap of that name in an unrelated namespace");
}

/// An emulator with the pruning install rendered into [`OTHER`] (its RBAC,
/// Namespace and policies), an editor there and in [`UNRELATED`], which
/// exists without nodegate.
async fn installed_in_another_namespace() -> Emulator {
    let rendered =
        nodegate_e2e::manifests::kustomize_in_namespace(OTHER, "manifests", &["pruning"]).unwrap();
    let objects = nodegate_e2e::manifests::by_kind_and_name(&rendered).unwrap();
    let policy = &objects[&(
        "ValidatingAdmissionPolicy".to_string(),
        "nodegate-roster-writers".to_string(),
    )];
    assert!(
        !serde_json::to_string(policy)
            .unwrap()
            .contains(":nodegate:"),
        "the writers' policy names no namespace: {policy}"
    );
    let emu = Emulator::start(EmulatorOptions {
        rbac: Some(vec![
            rendered.clone(),
            editor_rbac("editor", OTHER),
            editor_rbac("editor", UNRELATED),
        ]),
        ..Default::default()
    })
    .await
    .unwrap();
    for ((kind, _), obj) in &objects {
        if matches!(
            kind.as_str(),
            "Namespace" | "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"
        ) {
            emu.apply(&obj.to_string()).unwrap();
        }
    }
    let namespace = &objects[&("Namespace".to_string(), OTHER.to_string())];
    assert_eq!(
        namespace["metadata"]["labels"]["app.kubernetes.io/part-of"], "nodegate",
        "kustomize keeps the install's Namespace label"
    );
    emu.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": UNRELATED}})
            .to_string(),
    )
    .unwrap();
    emu
}

/// That namespace's publisher account: the real binary leads and publishes.
async fn the_moved_publisher_publishes(emu: &Emulator, admin: &kube::Client) -> LoggedChild {
    let account = format!("system:serviceaccount:{OTHER}:nodegate-roster");
    let p = publisher(&emu.kubeconfig(&account).unwrap(), OTHER, "moved-0", 4);
    eventually_some("the moved publisher leads", WAIT, || async {
        let l = holder(admin, OTHER).await?;
        (holder_of(&l) == Some("moved-0")).then_some(())
    })
    .await;
    eventually_some("the moved roster is published", WAIT, || async {
        published(admin, OTHER, 4).await
    })
    .await;
    p
}

/// The editor of [`OTHER`] can neither take nor delete the moved Lease, nor
/// rewrite a moved shard. Returns the Lease as the editor would have taken
/// it.
async fn the_moved_roster_is_not_the_editors(leases: &Api<Lease>, editor: &kube::Client) -> Lease {
    let cms: Api<ConfigMap> = Api::namespaced(editor.clone(), OTHER);
    let mut taken = leases.get(DEFAULT_NAME).await.unwrap();
    taken
        .spec
        .get_or_insert_with(Default::default)
        .holder_identity = Some("editor".into());
    refused(
        "editor takes the moved Lease",
        leases
            .replace(DEFAULT_NAME, &PostParams::default(), &taken)
            .await,
        &[WRITERS, LEASE_MSG],
    );
    refused(
        "editor deletes the moved Lease",
        leases.delete(DEFAULT_NAME, &DeleteParams::default()).await,
        &[WRITERS, LEASE_MSG],
    );
    let shard0 = shard::name_of(DEFAULT_NAME, 0);
    let mut poisoned = cms.get(&shard0).await.unwrap();
    poisoned.data = Some(BTreeMap::from([(
        shard::DATA_KEY.to_string(),
        "{}".to_string(),
    )]));
    refused(
        "editor rewrites a moved shard",
        cms.replace(&shard0, &PostParams::default(), &poisoned)
            .await,
        &[
            WRITERS,
            "only the nodegate-roster ServiceAccount may write roster shards, not editor",
        ],
    );
    taken
}
