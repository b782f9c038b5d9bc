//! A reboot: the taint back on the main resource within a second, from the
//! first stored version with the new boot, whoever writes first; a restart
//! or a dry-run reboot write re-taints nothing, and a stale patch never
//! re-taints a node ready on its boot.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_e2e::standin::{AgentReadiness, StandInAgent};
use nodegate_emulator::users;
use nodegate_shared::keys::{DEFAULT_TAINT, READY_BOOT_ID_ANNOTATION};
use nodegate_shared::patch::{Guard, add_taints};
use nodegate_shared::{NodeView, TaintSpec};
use serde_json::json;

use crate::support::admission::no_ignored_failures;
use crate::support::poll::{eventually, throughout};
use crate::support::registration::registered_and_ready;
use crate::support::taints::{TAINT_KEY, has_taint, taint_keys};

#[tokio::test]
async fn reboot_retaints_within_a_second_and_kubelet_writes_are_never_rejected() {
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, agent_client) = registered_and_ready(&c, "reboot").await;
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let n = api.get(&name).await.unwrap();
    assert!(!has_taint(&n));
    assert_eq!(
        n.metadata.annotations.unwrap()[READY_BOOT_ID_ANNOTATION],
        kubelet.boot_id()
    );

    // Heartbeats and a kubelet restart on the same boot: accepted, nothing changes.
    kubelet.heartbeat().await.unwrap();
    kubelet.restart().await.unwrap();
    throughout(
        "no taint without a reboot",
        Duration::from_millis(1500),
        async || !has_taint(&api.get(&name).await.unwrap()),
    )
    .await;

    // Reboot: the kubelet's create (409) and status write are not rejected…
    kubelet.reboot().await.unwrap();
    // …and the taint is back on the main resource within 1 s.
    eventually(
        "taint back after reboot",
        Duration::from_secs(1),
        async || has_taint(&api.get(&name).await.unwrap()),
    )
    .await;
    // Heartbeats before the agent is ready are accepted too. (Sent after the
    // taint landed: a heartbeat racing the background patch can queue a
    // second one, whose taint-list guard is open to an ABA race with the
    // agent's removal — see emulator/README.md, "Findings".)
    kubelet.heartbeat().await.unwrap();

    // The agent becomes ready on the new boot; later kubelet writes stay accepted.
    StandInAgent::default()
        .mark_ready(&agent_client, &name)
        .await
        .unwrap();
    kubelet.heartbeat().await.unwrap();
    assert!(!has_taint(&api.get(&name).await.unwrap()));
    no_ignored_failures(&c);
}

#[tokio::test]
async fn dry_run_reboot_status_write_retaints_nothing() {
    let c = Cluster::start().await.unwrap();
    let (name, kubelet, _) = registered_and_ready(&c, "dryboot").await;
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let out = kubelet
        .api()
        .patch_status(
            &name,
            &dry,
            &Patch::Strategic(json!({"status": {"nodeInfo": {"bootID": "a-new-boot"}}})),
        )
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().node_info.unwrap().boot_id, "a-new-boot");
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    throughout(
        "no taint after a dry-run reboot write",
        Duration::from_millis(1500),
        async || {
            let n = api.get(&name).await.unwrap();
            !has_taint(&n) && n.status.unwrap().node_info.unwrap().boot_id == kubelet.boot_id()
        },
    )
    .await;
    no_ignored_failures(&c);
}

#[tokio::test]
async fn node_controller_patch_after_a_reboot_carries_the_taint() {
    // `Rule::UpdateAfterReboot`: a main-resource write after a reboot (here the node lifecycle
    // controller's strategic merge patch of the whole taint list, with its
    // resourceVersion lock) gets the taint added in the same write — even when
    // the list it sends lacks nodegate's taint (a cache from before it landed).
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, _) = registered_and_ready(&c, "nlc").await;
    kubelet.reboot().await.unwrap();
    let nlc: Api<Node> = Api::all(c.client(users::NODE_CONTROLLER).await.unwrap());
    let patched = loop {
        let n = nlc.get(&name).await.unwrap();
        let rv = n.metadata.resource_version.clone();
        let others: Vec<_> = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != TAINT_KEY && t.key != "node.kubernetes.io/not-ready")
            .collect();
        let patch = json!({"metadata": {"resourceVersion": rv}, "spec": {"taints": others}});
        match nlc
            .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(n) => break n,
            // The background patch moved the node on meanwhile: read again, as the controller does.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert!(has_taint(&patched), "{:?}", taint_keys(&patched));
    assert!(!taint_keys(&patched).contains(&"node.kubernetes.io/not-ready".to_string()));
    no_ignored_failures(&c);
}

/// A reboot patch read before the agent became ready on the new boot must not
/// apply afterwards, even when the taint list went back to what was read (ABA).
#[tokio::test]
async fn stale_reboot_patch_must_not_retaint_a_node_ready_on_its_boot() {
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, agent) = registered_and_ready(&c, "aba").await;
    kubelet.reboot().await.unwrap();
    let webhook: Api<Node> = Api::all(c.webhook_client().await.unwrap());
    // What the webhook's patcher read right after the reboot, before its taint landed.
    let mut seen = serde_json::to_value(webhook.get(&name).await.unwrap()).unwrap();
    seen["spec"]["taints"] =
        json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]);
    let view: NodeView = serde_json::from_value(seen).unwrap();
    let specs: Vec<TaintSpec> = vec![DEFAULT_TAINT.parse().unwrap()];
    let stale = add_taints(&view, &view.missing(&specs), Guard::Current);
    // The taint lands, then the agent is ready on the new boot and removes it.
    eventually(
        "taint back after reboot",
        Duration::from_secs(1),
        async || has_taint(&webhook.get(&name).await.unwrap()),
    )
    .await;
    StandInAgent::default()
        .mark_ready(&agent, &name)
        .await
        .unwrap();
    // The stale patch arrives now: it must not apply.
    let r = webhook
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(stale))
        .await;
    assert!(
        r.is_err(),
        "a stale guarded patch re-tainted a node whose agent is ready on its boot"
    );
    no_ignored_failures(&c);
}

/// A crash reboot: the kubelet's first write on the new boot is its create
/// of the existing Node (409), then its status write with the new bootID.
/// The webhook re-taints the stored node while it answers that create, so the
/// first stored version that carries the new bootID already carries the
/// taint: no window in which a scheduler could bind a pod to it. A kubelet
/// restart on the same boot changes nothing.
#[tokio::test]
async fn first_stored_version_with_a_new_boot_is_tainted() {
    let c = Cluster::start().await.unwrap();
    let (name, mut kubelet, _agent) = registered_and_ready(&c, "reregister").await;
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let before = api.get(&name).await.unwrap();
    assert!(!has_taint(&before), "ready before the crash");
    let boot = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .unwrap_or_default()
    };
    let old_boot = boot(&before);

    // A restart on the same boot: no taint, nothing stored by nodegate.
    kubelet.restart().await.unwrap();
    throughout(
        "a kubelet restart adds no taint",
        Duration::from_millis(1500),
        async || !has_taint(&api.get(&name).await.unwrap()),
    )
    .await;

    let rv = api
        .get(&name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(10);
    let mut versions = api.watch(&wp, &rv).await.unwrap().boxed();
    kubelet.reboot().await.unwrap();
    let first_on_new_boot = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = versions.try_next().await.unwrap() {
            if let WatchEvent::Added(n) | WatchEvent::Modified(n) = ev
                && boot(&n) != old_boot
            {
                return n;
            }
        }
        panic!("the watch ended before a version with the new bootID");
    })
    .await
    .expect("a stored version with the new bootID");
    assert!(
        has_taint(&first_on_new_boot),
        "first stored version with bootID {} has taints {:?}",
        boot(&first_on_new_boot),
        taint_keys(&first_on_new_boot)
    );
    no_ignored_failures(&c);
}
