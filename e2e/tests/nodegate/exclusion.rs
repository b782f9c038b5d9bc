//! The exclude label: an admin's excludes a node, a kubelet cannot set it
//! on itself, and the former label excludes nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::EXCLUDE_LABEL;
use serde_json::json;

use crate::support::admission::no_ignored_failures;
use crate::support::kubectl::kubectl;
use crate::support::poll::{eventually, throughout};
use crate::support::registration::registered_and_ready;
use crate::support::taints::{TAINT_KEY, has_taint, taint_keys};

/// The exclude label before it moved under node-restriction.kubernetes.io.
const OLD_EXCLUDE_LABEL: &str = "nodegate.dev/exclude";

/// The exclude label is under node-restriction.kubernetes.io, so only an
/// admin sets it: on a Node created with it, or on a registered one (with
/// the taint then removed by hand), nodegate does nothing, also at a reboot.
#[tokio::test]
async fn excluded_node_is_left_alone() {
    let c = Cluster::start().await.unwrap();
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    // Created by an admin with the label: left alone, the kubelet's
    // registration (AlreadyExists, then a status write) too.
    let name = c.node_name("excluded");
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {EXCLUDE_LABEL: "true"}}
    }))
    .unwrap();
    let n = api.create(&PostParams::default(), &node).await.unwrap();
    assert!(!has_taint(&n), "{:?}", taint_keys(&n));
    let kubelet = c.kubelet(&name).await.unwrap();
    let n = kubelet.register().await.unwrap();
    assert!(!has_taint(&n), "{:?}", taint_keys(&n));
    if !c.is_real() {
        assert!(taint_keys(&n).contains(&"node.kubernetes.io/not-ready".to_string()));
    }

    // Labelled after registration: it registered gated; the admin labels it
    // and removes the taint, and a reboot no longer brings it back.
    let name = c.node_name("excluded-later");
    let mut kubelet = c.kubelet(&name).await.unwrap();
    assert!(has_taint(&kubelet.register().await.unwrap()));
    let label = format!("{EXCLUDE_LABEL}=true");
    assert!(
        kubectl(&c, &["label", "node", &name, &label])
            .await
            .status
            .success()
    );
    let untaint = format!("{TAINT_KEY}:NoSchedule-");
    assert!(
        kubectl(&c, &["taint", "node", &name, &untaint])
            .await
            .status
            .success()
    );
    kubelet.reboot().await.unwrap();
    kubelet.heartbeat().await.unwrap();
    throughout(
        "no taint on an excluded node after a reboot",
        Duration::from_millis(1500),
        async || !has_taint(&api.get(&name).await.unwrap()),
    )
    .await;
    no_ignored_failures(&c);
}

/// A kubelet cannot switch its own gate off: NodeRestriction refuses the
/// exclude label from its identity on update (main resource and status)
/// and at create (what `--node-labels` would send), and the node stays gated.
#[tokio::test]
async fn a_kubelet_cannot_exclude_its_own_node() {
    let c = Cluster::start().await.unwrap();
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let name = c.node_name("optout");
    let kubelet = c.kubelet(&name).await.unwrap();
    assert!(has_taint(&kubelet.register().await.unwrap()));
    let label = Patch::Merge(json!({"metadata": {"labels": {EXCLUDE_LABEL: "true"}}}));
    for status in [false, true] {
        let refused = if status {
            kubelet
                .api()
                .patch_status(&name, &PatchParams::default(), &label)
                .await
        } else {
            kubelet
                .api()
                .patch(&name, &PatchParams::default(), &label)
                .await
        };
        let Err(kube::Error::Api(e)) = refused else {
            panic!("status: {status}: the kubelet labelled its node: {refused:?}");
        };
        assert_eq!(e.code, 403, "status: {status}: {e:?}");
        assert!(
            e.message
                .contains(&format!("is not allowed to modify labels: {EXCLUDE_LABEL}")),
            "{}",
            e.message
        );
    }
    let n = api.get(&name).await.unwrap();
    assert!(has_taint(&n));
    assert!(
        !n.metadata
            .labels
            .unwrap_or_default()
            .contains_key(EXCLUDE_LABEL)
    );

    // At create: refused, nothing stored.
    let name = c.node_name("optout-at-create");
    let err = c
        .kubelet(&name)
        .await
        .unwrap()
        .with_label(EXCLUDE_LABEL, "true")
        .register()
        .await
        .unwrap_err();
    let Some(kube::Error::Api(e)) = err.downcast_ref::<kube::Error>() else {
        panic!("{err:#}");
    };
    assert_eq!(e.code, 403, "{e:?}");
    assert!(
        e.message.contains(&format!(
            "is not allowed to set the following labels: {EXCLUDE_LABEL}"
        )),
        "{}",
        e.message
    );
    assert!(api.get_opt(&name).await.unwrap().is_none());
    no_ignored_failures(&c);
}

/// The former exclude label, which any kubelet may set on itself, excludes
/// nothing: a node that registers with it is gated, and one that labels
/// itself with it later is re-gated at its next reboot.
#[tokio::test]
async fn the_old_exclude_label_excludes_nothing() {
    let c = Cluster::start().await.unwrap();
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let name = c.node_name("old-label");
    let kubelet = c
        .kubelet(&name)
        .await
        .unwrap()
        .with_label(OLD_EXCLUDE_LABEL, "true");
    let n = kubelet.register().await.unwrap();
    assert_eq!(
        n.metadata.labels.as_ref().unwrap()[OLD_EXCLUDE_LABEL],
        "true"
    );
    assert!(has_taint(&n), "{:?}", taint_keys(&n));

    let (name, mut kubelet, _) = registered_and_ready(&c, "old-label-later").await;
    let n = kubelet
        .api()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {OLD_EXCLUDE_LABEL: "true"}}})),
        )
        .await
        .unwrap();
    assert!(!has_taint(&n));
    kubelet.reboot().await.unwrap();
    eventually(
        "taint back after a reboot despite the old label",
        Duration::from_secs(1),
        async || has_taint(&api.get(&name).await.unwrap()),
    )
    .await;
    no_ignored_failures(&c);
}
