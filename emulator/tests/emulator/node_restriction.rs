//! What a kubelet may do with Nodes: the node authorizer's reads, and
//! NodeRestriction on its writes (its own Node, its labels, never taints,
//! nothing under node-restriction.kubernetes.io), also after a webhook's
//! mutation.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodegate_emulator::fake_webhook::FakeReply;
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::{Emulator, users};
use serde_json::json;

use crate::support::{
    NOT_READY, api_reason, emulator, node, nodes, poll, taint_keys, with_fake, with_node_a,
};

/// nodegate's exclude label: NodeRestriction keeps every label under this
/// prefix out of a kubelet's reach.
const RESTRICTED: &str = "node-restriction.kubernetes.io/nodegate-exclude";

/// A fresh emulator holding the admin's node `other`, the admin's Node API,
/// and the kubelet of node `mine` registered with a taint of its own, with
/// the Node it stored.
async fn kubelet_of_mine() -> (Emulator, Api<Node>, SimKubelet, Node) {
    let emu = emulator().await;
    let admin = nodes(&emu, users::ADMIN).await;
    admin
        .create(&PostParams::default(), &node("other"))
        .await
        .unwrap();
    let kubelet = SimKubelet::new(&emu, "mine")
        .await
        .unwrap()
        .register_with_taints(vec![
            json!({"key": "example.com/reg", "effect": "NoSchedule"}),
        ]);
    let n = kubelet.register().await.unwrap();
    (emu, admin, kubelet, n)
}

/// A kubelet writes its own Node only, never its taints, and no labels in
/// the kubernetes.io namespaces outside its own set.
#[tokio::test]
async fn node_restriction_limits_a_kubelet_to_its_own_node_labels_and_no_taints() {
    let (_emu, _admin, kubelet, n) = kubelet_of_mine().await;
    assert_eq!(taint_keys(&n), vec!["example.com/reg", NOT_READY]);
    let api = kubelet.api();
    // Not its own node.
    let err = api
        .patch(
            "other",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap_err();
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(
        msg.contains("is not allowed to modify node \"other\""),
        "{msg}"
    );
    // Its own taints.
    let err = api
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": []}})),
        )
        .await
        .unwrap_err();
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(msg.contains("is not allowed to modify taints"), "{msg}");
    // Nor labels in the kubernetes.io namespaces outside its own set.
    let err = api
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}})),
        )
        .await
        .unwrap_err();
    let (code, _, msg) = api_reason(&err);
    assert_eq!(code, 403);
    assert!(
        msg.contains("is not allowed to modify labels: node-role.kubernetes.io/worker"),
        "{msg}"
    );
    // Its own labels elsewhere are fine (nodegate's former exclude label too).
    api.patch(
        "mine",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"nodegate.dev/exclude": "true"}}})),
    )
    .await
    .unwrap();
}

/// Nothing under node-restriction.kubernetes.io from a kubelet, on the main
/// resource or status, not even removing an admin's label; its writes that
/// leave that label as it is go through.
#[tokio::test]
async fn node_restriction() {
    let (_emu, admin, kubelet, _) = kubelet_of_mine().await;
    let api = kubelet.api();
    // Nothing under node-restriction.kubernetes.io, main resource or status.
    for status in [false, true] {
        let patch = Patch::Merge(json!({"metadata": {"labels": {RESTRICTED: "true"}}}));
        let err = if status {
            api.patch_status("mine", &PatchParams::default(), &patch)
                .await
        } else {
            api.patch("mine", &PatchParams::default(), &patch).await
        }
        .unwrap_err();
        let (code, _, msg) = api_reason(&err);
        assert_eq!(code, 403, "status: {status}");
        assert!(
            msg.contains(&format!("is not allowed to modify labels: {RESTRICTED}")),
            "{msg}"
        );
    }
    // Status writes and restarts are fine.
    kubelet.heartbeat().await.unwrap();
    kubelet.restart().await.unwrap();
    // An admin's node-restriction label stays out of the kubelet's reach
    // but does not block its writes that leave it as it is.
    admin
        .patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {RESTRICTED: "true"}}})),
        )
        .await
        .unwrap();
    kubelet.heartbeat().await.unwrap();
    kubelet.restart().await.unwrap();
    for labels in [json!({RESTRICTED: "false"}), json!({RESTRICTED: null})] {
        let err = api
            .patch(
                "mine",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .unwrap_err();
        let (code, _, msg) = api_reason(&err);
        assert_eq!(code, 403, "{labels}");
        assert!(
            msg.contains(&format!("is not allowed to modify labels: {RESTRICTED}")),
            "{msg}"
        );
    }
}

/// Nor at create: a kubelet cannot register with the label.
#[tokio::test]
async fn node_restriction_refuses_registering_with_its_label() {
    let emu = emulator().await;
    let admin = nodes(&emu, users::ADMIN).await;
    // Nor at create: a kubelet cannot register with it (`--node-labels`).
    let err = SimKubelet::new(&emu, "optout")
        .await
        .unwrap()
        .with_label(RESTRICTED, "true")
        .register()
        .await
        .unwrap_err();
    let Some(kube::Error::Api(e)) = err.downcast_ref::<kube::Error>() else {
        panic!("{err:#}");
    };
    assert_eq!(e.code, 403);
    assert!(
        e.message.contains(&format!(
            "node \"optout\" is not allowed to set the following labels: {RESTRICTED}"
        )),
        "{}",
        e.message
    );
    assert!(admin.get_opt("optout").await.unwrap().is_none());
}

/// `node_authorizer.go` authorizeNode: a kubelet reads only its own Node
/// (get, or list/watch with a `metadata.name` field selector), never
/// `nodes/status`, and may write (NodeRestriction limits what).
#[tokio::test]
async fn node_authorizer_limits_kubelet_reads() {
    let (emu, admin) = with_node_a().await;
    admin
        .create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    let kubelet = nodes(&emu, &users::node("a")).await;
    assert_eq!(
        kubelet.get("a").await.unwrap().metadata.name.as_deref(),
        Some("a")
    );
    let e = kubelet.get("b").await.unwrap_err();
    let (code, _, msg) = api_reason(&e);
    assert_eq!(code, 403, "{msg}");
    assert!(
        msg.contains("node 'a' cannot read 'b', only its own Node object"),
        "{msg}"
    );
    let e = kubelet.list(&ListParams::default()).await.unwrap_err();
    assert!(api_reason(&e).2.contains("cannot read all nodes"));
    let own = kubelet
        .list(&ListParams::default().fields("metadata.name=a"))
        .await
        .unwrap();
    assert_eq!(own.items.len(), 1);
    let r = emu
        .raw(
            Some(&users::node("a")),
            "GET",
            "/api/v1/nodes/a/status",
            "",
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 403, "a kubelet may not read nodes/status");
    kubelet
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"bootID": "boot-2"}}})),
        )
        .await
        .unwrap();
    let e = kubelet
        .delete("a", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_reason(&e).0, 403);
}

#[tokio::test]
async fn a_webhook_that_taints_a_kubelet_update_gets_it_forbidden() {
    // What nodegate must never do: mutate taints on the kubelet's own writes.
    let (emu, _fake) = with_fake(json!({}), |req| FakeReply {
        patch: (req["operation"] == "UPDATE").then(|| {
            json!([{"op": "add", "path": "/spec/taints/-", "value": {"key": "example.com/x", "effect": "NoSchedule"}}])
        }),
        ..Default::default()
    })
    .await;
    let kubelet = SimKubelet::new(&emu, "a").await.unwrap();
    kubelet.register().await.unwrap();
    let err = kubelet.heartbeat().await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("is not allowed to modify taints"), "{msg}");
    poll("no change stored", Duration::from_secs(1), || async {
        let n = kubelet.api().get("a").await.ok()?;
        (taint_keys(&n) == vec![NOT_READY]).then_some(())
    })
    .await;
}
