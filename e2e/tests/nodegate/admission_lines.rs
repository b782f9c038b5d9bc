//! The lines of admission (the first line and one per replica): the
//! backups are never called while the first answers, the first only for
//! writes a rule can act on, and a dead replica leaves no node ungated.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_e2e::standin::{AgentReadiness, StandInAgent};
use nodegate_emulator::admission::{WEBHOOK_FAIL_OPEN, WEBHOOK_REQUESTS};
use nodegate_emulator::kubelet::SimKubelet;
use nodegate_emulator::users;
use serde_json::json;

use crate::support::admission::no_ignored_failures;
use crate::support::registration::registered_and_ready;
use crate::support::taints::has_taint;

/// Calls of each line so far: (first, replica-0's, replica-1's).
fn line_calls(emu: &nodegate_emulator::Emulator) -> (usize, usize, usize) {
    let calls = emu.webhook_calls(false);
    let n = |name: &str| calls.iter().filter(|c| c.webhook == name).count();
    (
        n("nodes.nodegate.dev"),
        n("replica-0.nodes.nodegate.dev"),
        n("replica-1.nodes.nodegate.dev"),
    )
}

#[tokio::test]
async fn backup_lines_are_never_called_while_the_first_answers() {
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: counts the API server's webhook calls");
        return;
    };
    // A registration, heartbeats, a restart, a reboot, an admin's label on
    // the ready node, the agent's ready patch: every kind of Node write.
    let (name, mut kubelet, agent) = registered_and_ready(&c, "steady").await;
    for _ in 0..3 {
        kubelet.heartbeat().await.unwrap();
    }
    kubelet.restart().await.unwrap();
    let admin: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    admin
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    kubelet.reboot().await.unwrap();
    drop(agent);
    let (first, r0, r1) = line_calls(emu);
    assert!(
        first >= 4,
        "the first line answered every write it gets: {first}"
    );
    assert_eq!((r0, r1), (0, 0), "a backup line was called in steady state");
    no_ignored_failures(&c);
}

/// The first line is called only for a write a rule can act on: a create,
/// a status write that can mean a reboot, an update of a node that rebooted
/// since its agent was ready. The agent's ready patch, heartbeats and an
/// admin's label on a ready node cost the API server no call.
#[tokio::test]
async fn the_first_line_sees_only_writes_a_rule_can_act_on() {
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: counts the API server's webhook calls");
        return;
    };
    let first = || {
        emu.webhook_calls(true)
            .iter()
            .filter(|c| c.webhook == "nodes.nodegate.dev")
            .count()
    };
    let name = c.node_name("calls");
    let mut kubelet = c.kubelet(&name).await.unwrap();
    first();
    kubelet.register().await.unwrap();
    assert!(first() >= 1, "the registration's create");
    let agent = c.agent_client(&name).await.unwrap();
    StandInAgent::default()
        .mark_ready(&agent, &name)
        .await
        .unwrap();
    assert_eq!(first(), 0, "the agent's ready patch");
    for _ in 0..3 {
        kubelet.heartbeat().await.unwrap();
    }
    assert_eq!(first(), 0, "heartbeats");
    let admin: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let label = |v: &'static str| {
        let admin = admin.clone();
        let name = name.clone();
        async move {
            admin
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"team": v}}})),
                )
                .await
                .unwrap()
        }
    };
    label("a").await;
    assert_eq!(first(), 0, "an admin's label on a ready node");
    kubelet.reboot().await.unwrap();
    assert!(first() >= 1, "the reboot's create");
    // Rebooted, not ready again yet: `Rule::UpdateAfterReboot` may have to put taints back.
    let n = label("b").await;
    assert!(has_taint(&n));
    assert_eq!(first(), 1, "an admin's label on a rebooted node");
    no_ignored_failures(&c);
}

/// Replica 0 dead (its node gone, its endpoint still listed): the first
/// line's call to it fails open, replica 0's own line fails open too, and
/// replica 1's line taints the Node. Not one write stored ungated.
#[tokio::test]
async fn a_dead_replica_fails_no_node_open_while_the_other_serves() {
    let c = Cluster::start().await.unwrap();
    let Some(emu) = c.emulator() else {
        eprintln!("skipped on a real cluster: needs a dead replica");
        return;
    };
    // A port nothing listens on: connections are refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    emu.set_service_endpoint("nodegate-webhook.nodegate.svc", dead);
    emu.set_service_endpoint("nodegate-webhook-0.nodegate.svc", dead);
    for i in 0..5 {
        let kubelet = SimKubelet::new(emu, &format!("during-{i}")).await.unwrap();
        let n = kubelet.register().await.unwrap();
        assert!(has_taint(&n), "during-{i} stored ungated");
    }
    let m = emu.admission_metrics();
    let get = |metric: &str, name: &str| m.get(metric, name, None);
    assert_eq!(get(WEBHOOK_FAIL_OPEN, "nodes.nodegate.dev"), 5);
    assert_eq!(get(WEBHOOK_FAIL_OPEN, "replica-0.nodes.nodegate.dev"), 5);
    assert_eq!(get(WEBHOOK_REQUESTS, "replica-1.nodes.nodegate.dev"), 5);
    assert_eq!(get(WEBHOOK_FAIL_OPEN, "replica-1.nodes.nodegate.dev"), 0);
    // Every replica dead: the write is stored ungated (failurePolicy
    // Ignore), and the alert's count sees it.
    emu.set_service_endpoint("nodegate-webhook-1.nodegate.svc", dead);
    let n = SimKubelet::new(emu, "all-dead")
        .await
        .unwrap()
        .register()
        .await
        .unwrap();
    assert!(!has_taint(&n));
    let backups = [
        "replica-0.nodes.nodegate.dev",
        "replica-1.nodes.nodegate.dev",
    ];
    let sum = |metric: &str| backups.iter().map(|b| get(metric, b)).sum::<u64>();
    let no_line_answered =
        get(WEBHOOK_REQUESTS, backups[0]) - (sum(WEBHOOK_REQUESTS) - sum(WEBHOOK_FAIL_OPEN));
    assert_eq!(no_line_answered, 1);
}
