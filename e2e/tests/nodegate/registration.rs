//! A new node: tainted from its very first write, registered anyway while
//! the webhook is down (failurePolicy Ignore), and its heartbeats never
//! reach the webhook.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher;
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::users;
use nodegate_shared::keys::DEFAULT_TAINT;

use crate::support::admission::no_ignored_failures;
use crate::support::taints::{TAINT_KEY, has_taint, taint_keys};

#[tokio::test]
async fn new_node_is_tainted_from_its_first_write() {
    let c = Cluster::start().await.unwrap();
    let name = c.node_name("fresh");
    let api: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    // A watcher that started before the node existed sees its very first version.
    let mut events = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .boxed();
    // Drain the (empty) initial list.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(watcher::Event::InitDone) => break,
            Some(_) => {}
            None => panic!("watch ended"),
        }
    }
    let kubelet = c.kubelet(&name).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert!(
        has_taint(&created),
        "create response: {:?}",
        taint_keys(&created)
    );
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(watcher::Event::Apply(n)) = events.try_next().await.unwrap() {
                return n;
            }
        }
    })
    .await
    .unwrap();
    assert!(has_taint(&first));
    if let Some(w) = c.webhook_ref() {
        let metrics = w.metrics().await.unwrap();
        assert!(
            metrics.contains(r#"nodegate_webhook_taints_added_total{reason="create"} 1"#),
            "{metrics}"
        );
    }
    no_ignored_failures(&c);
}

#[tokio::test]
async fn webhook_down_with_failure_policy_ignore_still_registers() {
    let mut c = Cluster::start().await.unwrap();
    if c.is_real() {
        eprintln!("skipped on a real cluster: needs to stop the webhook");
        return;
    }
    // An abrupt outage: the process is gone, connections are refused.
    c.webhook().unwrap().kill().await.unwrap();
    let kubelet = SimKubelet::new(c.emulator().unwrap(), "orphan")
        .await
        .unwrap();
    let n = kubelet.register().await.unwrap();
    assert!(!has_taint(&n));
    assert_eq!(taint_keys(&n), vec!["node.kubernetes.io/not-ready"]);
    kubelet.heartbeat().await.unwrap();
}

#[tokio::test]
async fn default_taint_is_what_the_webhook_adds() {
    // Guards the suites' TAINT_KEY (tests/support/taints.rs) against drift
    // in shared/.
    assert!(DEFAULT_TAINT.starts_with(TAINT_KEY));
}

#[tokio::test]
async fn heartbeats_never_reach_the_webhook() {
    // The shipped matchConditions (CEL) keep status writes that keep the
    // bootID away from the webhook; a bootID change gets through.
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: counts the API server's webhook calls");
        return;
    };
    let mut kubelet = SimKubelet::new(emu, "hb").await.unwrap();
    kubelet.register().await.unwrap();
    let after_register = emu.webhook_calls(false).len();
    assert_eq!(after_register, 1, "the create");
    for _ in 0..3 {
        kubelet.heartbeat().await.unwrap();
    }
    kubelet.restart().await.unwrap();
    // The restart's create (409 after admission) is a CREATE: it is called.
    assert_eq!(emu.webhook_calls(false).len(), after_register + 1);
    kubelet.reboot().await.unwrap();
    // Create again, then the status write with the new bootID.
    assert_eq!(emu.webhook_calls(false).len(), after_register + 3);
    no_ignored_failures(&c);
}
