//! End-to-end, the readiness gate: the webhook's taint comes off once the
//! probes pass and goes back after a reboot; the safety net and the
//! shutdown re-taint; `--continuous`; `--probe-pod`; an autoscaler that did
//! not wait. The harness and real-cluster mode: `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use nodegate_e2e::cluster::Cluster;
use nodegate_emulator::users;
use nodegate_shared::keys::DEFAULT_TAINT;
use serde_json::{Value, json};

use support::nodes::{
    TAINT_KEY, boot_id, cluster, has_taint, node, node_events, our_taint, ready_boot_id,
};
use support::process::Agent;
use support::wait::eventually;

/// The taint goes on with the webhook at create, comes off only after the
/// probe file appears (reacting through inotify: the probe period is an
/// hour), goes back on after a reboot and comes off again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_taints_agent_untaints_after_probe_file_and_after_reboot() {
    let (c, nodes) = cluster().await;
    let node_a = c.node_name("node-a");
    let mut kubelet = c.kubelet(&node_a).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert!(our_taint(&created), "webhook taints the node at create");

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("cni").join("05-cilium.conflist");
    std::fs::create_dir_all(probe.parent().unwrap()).unwrap();
    let probe_arg = probe.to_str().unwrap().to_string();
    let mut agent = Agent::start(
        &c,
        &node_a,
        &dir.path().join("state"),
        // One failed round is not-ready: the agent on the old boot must not be
        // ready when the simulated reboot happens (on a real crash it is dead).
        &[
            "--probe-file",
            &probe_arg,
            "--probe-period",
            "1h",
            "--failure-threshold",
            "1",
        ],
    )
    .await;

    // The first round ran and failed: the node must still be tainted.
    // Labelled by kind and index, never by the path.
    let series = r#"nodegate_agent_probe_results_total{kind="file",index="0",result="fail"}"#;
    eventually("a failed probe round", || async {
        agent.metric(series).await.unwrap_or(0.0) >= 1.0
    })
    .await;
    let (_, exposition) = agent.get("/metrics").await;
    assert!(!exposition.contains(&probe_arg), "probe path in metrics");
    let n = node(&nodes, &node_a).await;
    assert!(our_taint(&n), "not untainted before the probe file exists");
    assert_eq!(ready_boot_id(&n), None);

    // An empty file is not ready either; content makes it ready.
    std::fs::write(&probe, b"").unwrap();
    std::fs::write(&probe, br#"{"cniVersion":"0.3.1","name":"cilium"}"#).unwrap();
    eventually("taint removed after the probe file appeared", || async {
        let n = node(&nodes, &node_a).await;
        !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    let n = node(&nodes, &node_a).await;
    let others: Vec<_> = n.spec.unwrap().taints.unwrap_or_default();
    assert!(
        others.iter().all(|t| t.key != TAINT_KEY),
        "only our taint removed: {others:?}"
    );
    webhook_gate_removal_is_announced(&c, &agent, &node_a).await;

    // Reboot: the network agent is not up yet on the new boot. (A crash
    // reboot kills the agent too; this one keeps running, so it is made to
    // see its probe fail first, as it would before a reboot it survives.)
    std::fs::remove_file(&probe).unwrap();
    eventually("the agent sees its probe fail", || async {
        agent.metric("nodegate_agent_ready").await == Some(0.0)
    })
    .await;
    let old_boot = kubelet.boot_id().to_string();
    kubelet.reboot().await.unwrap();
    assert_ne!(kubelet.boot_id(), old_boot);
    eventually("webhook re-taints after the reboot", || async {
        let n = node(&nodes, &node_a).await;
        our_taint(&n) && boot_id(&n) == kubelet.boot_id()
    })
    .await;
    eventually("agent saw the reboot", || async {
        agent.logged("node rebooted; probes must pass again")
    })
    .await;
    let n = node(&nodes, &node_a).await;
    assert!(our_taint(&n), "still tainted while the probe fails");
    assert_eq!(ready_boot_id(&n).as_deref(), Some(old_boot.as_str()));

    std::fs::write(&probe, b"{}").unwrap();
    eventually("taint removed again on the new boot", || async {
        let n = node(&nodes, &node_a).await;
        !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    // Counted once the API server has answered the write, which can be after
    // a reader sees the taint gone.
    eventually("the second removal counted", || async {
        agent.metric("nodegate_agent_taint_removals_total").await == Some(2.0)
    })
    .await;
    assert!(agent.term().await.success());
}

/// The first ready patch on a node the webhook gated: logged, counted, a
/// NodegateReady Event, time-to-ready by origin `webhook`, and no alarm.
async fn webhook_gate_removal_is_announced(c: &Cluster, agent: &Agent, node: &str) {
    // Logged and counted once the API server has answered the write, which
    // can be after a reader sees the taint gone.
    eventually("the removal logged and counted", || async {
        agent.logged("node ready: taint removed")
            && agent.metric("nodegate_agent_taint_removals_total").await == Some(1.0)
    })
    .await;
    assert!(agent.logged("since_node_creation_ms"));
    let evs = node_events(c, node).await;
    assert!(
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("NodegateReady")),
        "a NodegateReady event on the node"
    );
    assert_eq!(
        agent.metric("nodegate_agent_taint_removals_total").await,
        Some(1.0)
    );
    // The webhook put the taint on: no alarm, and time-to-ready says so.
    assert_eq!(
        agent
            .metric("nodegate_agent_time_to_ready_seconds_count{origin=\"webhook\"}")
            .await,
        Some(1.0)
    );
    assert!(
        !evs.iter()
            .any(|e| e.reason.as_deref() == Some("NodegateWebhookMissed")),
        "no webhook-missed alarm when the webhook tainted the node"
    );
}

/// The install's taint. The test removes it (as an admin) right after the
/// node registers: for the agent that is exactly a node the webhook missed,
/// on an emulator and on a real cluster alike, without stopping anyone's
/// webhook. (The agent may only manage the taints the install's confinement
/// policy names, so it cannot gate on a test-only taint.)
const MISSED_TAINT: &str = "nodegate.dev/agent-not-ready";

/// The webhook missed the node: the safety net taints at start (and says so
/// loudly), the agent untaints when ready, and SIGTERM puts the taint back
/// before the process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_net_and_sigterm_retaint() {
    let (c, nodes) = cluster().await;
    let node_b = c.node_name("node-b");
    let missed = |n: &Node| has_taint(n, MISSED_TAINT);
    let kubelet = c.kubelet(&node_b).await.unwrap();
    let created = kubelet.register().await.unwrap();
    assert!(missed(&created), "the webhook adds it at create");
    // The miss: the taint is gone before the agent starts.
    let at = created
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|t| t.iter().position(|t| t.key == MISSED_TAINT))
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": format!("/spec/taints/{at}/key"), "value": MISSED_TAINT},
        {"op": "remove", "path": format!("/spec/taints/{at}")},
    ]))
    .unwrap();
    let admin: Api<Node> = Api::all(c.client(users::ADMIN).await.unwrap());
    let missed_node = admin
        .patch(&node_b, &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert!(!missed(&missed_node));

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    let probe_arg = probe.to_str().unwrap().to_string();
    let state = dir.path().join("state");
    let args = [
        "--taint",
        DEFAULT_TAINT,
        "--probe-file",
        probe_arg.as_str(),
        "--probe-period",
        "200ms",
    ];
    let mut agent = Agent::start(&c, &node_b, &state, &args).await;
    eventually("safety net adds the taint", || async {
        missed(&node(&nodes, &node_b).await)
    })
    .await;
    eventually("safety-net metric", || async {
        agent
            .metric("nodegate_agent_taint_adds_total{reason=\"safety_net\"}")
            .await
            == Some(1.0)
    })
    .await;
    // The loud signal: a Warning Event on the Node that names the miss.
    let uid = node(&nodes, &node_b).await.metadata.uid;
    eventually("NodegateWebhookMissed warning event", || async {
        node_events(&c, &node_b).await.iter().any(|e| {
            e.reason.as_deref() == Some("NodegateWebhookMissed")
                && e.type_.as_deref() == Some("Warning")
                && e.involved_object.kind.as_deref() == Some("Node")
                && e.involved_object.uid == uid
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains(kubelet.boot_id()) && m.contains(MISSED_TAINT))
        })
    })
    .await;

    std::fs::write(&probe, b"ok").unwrap();
    eventually("untainted when ready", || async {
        let n = node(&nodes, &node_b).await;
        !missed(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    // Time-to-ready is labelled by who put the taint on.
    eventually("time to ready, origin safety_net", || async {
        agent
            .metric("nodegate_agent_time_to_ready_seconds_count{origin=\"safety_net\"}")
            .await
            == Some(1.0)
    })
    .await;
    assert_eq!(
        agent
            .metric("nodegate_agent_time_to_ready_seconds_count{origin=\"webhook\"}")
            .await,
        None
    );

    let status = agent.term().await;
    assert!(status.success(), "clean exit: {status:?}");
    // Re-tainted before the process was gone.
    assert!(missed(&node(&nodes, &node_b).await));
    assert!(agent.logged("shutdown re-taint done"));

    // Restart on the same boot: the taint is there (annotation = bootID, so
    // the safety net has nothing to do) and comes off once ready.
    let mut agent = Agent::start(&c, &node_b, &state, &args).await;
    eventually("untainted again after restart", || async {
        !missed(&node(&nodes, &node_b).await)
    })
    .await;
    assert_eq!(
        agent
            .metric("nodegate_agent_taint_adds_total{reason=\"safety_net\"}")
            .await,
        None
    );
    assert!(agent.term().await.success());
    assert!(missed(&node(&nodes, &node_b).await));
}

/// Karpenter labels a gated node initialized when the gate is not among its
/// NodePool's startupTaints (it ignores undeclared taints): the agent's
/// ready patch finds the label on the node it ungates and says so with a
/// Warning Event and a count. A node without the label gets neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_karpenter_initialized_while_gated_gets_a_warning() {
    let (c, nodes) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    let probe_arg = probe.to_str().unwrap().to_string();
    let warned = |evs: &[Event]| {
        evs.iter()
            .filter(|e| e.reason.as_deref() == Some("NodegateGateNotDeclared"))
            .count()
    };
    for (base, labelled) in [("karpenter-a", true), ("karpenter-b", false)] {
        let name = c.node_name(base);
        let kubelet = c.kubelet(&name).await.unwrap();
        assert!(our_taint(&kubelet.register().await.unwrap()));
        if labelled {
            // What Karpenter's Initialization.Reconcile writes.
            let label = json!({"metadata": {"labels": {"karpenter.sh/initialized": "true"}}});
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(label))
                .await
                .unwrap();
        }
        let state = dir.path().join(base);
        let mut agent = Agent::start(&c, &name, &state, &["--probe-file", &probe_arg]).await;
        eventually("untainted", || async {
            let n = node(&nodes, &name).await;
            !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
        })
        .await;
        let uid = node(&nodes, &name).await.metadata.uid;
        let series = r#"nodegate_agent_gate_undeclared_total{autoscaler="karpenter"}"#;
        if labelled {
            eventually("the warning and its count", || async {
                let evs = node_events(&c, &name).await;
                let named = evs.iter().any(|e| {
                    e.reason.as_deref() == Some("NodegateGateNotDeclared")
                        && e.type_.as_deref() == Some("Warning")
                        && e.involved_object.uid == uid
                        && e.message.as_deref().is_some_and(|m| {
                            m.contains("nodegate.dev/agent-not-ready:NoSchedule")
                                && m.contains("startupTaints")
                        })
                });
                named && agent.metric(series).await == Some(1.0)
            })
            .await;
        } else {
            eventually("the ready Event", || async {
                node_events(&c, &name)
                    .await
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("NodegateReady"))
            })
            .await;
            assert_eq!(agent.metric(series).await, Some(0.0));
        }
        // The agent runs every action a ready patch led to before it exits.
        assert!(agent.term().await.success());
        let evs = node_events(&c, &name).await;
        assert_eq!(warned(&evs), usize::from(labelled), "{name}: {evs:?}");
    }
}

/// `--continuous`: the taint goes back after the failure threshold while the
/// network agent is down, and comes off again when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_mode_retaints_while_down() {
    let (c, nodes) = cluster().await;
    let node_c = c.node_name("node-c");
    let kubelet = c.kubelet(&node_c).await.unwrap();
    kubelet.register().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("ready");
    std::fs::write(&probe, b"ok").unwrap();
    let probe_arg = probe.to_str().unwrap().to_string();
    let args = [
        "--continuous",
        "--probe-file",
        probe_arg.as_str(),
        "--probe-period",
        "100ms",
        "--failure-threshold",
        "2",
    ];
    let mut agent = Agent::start(&c, &node_c, &dir.path().join("state"), &args).await;
    eventually("ready", || async {
        let n = node(&nodes, &node_c).await;
        !our_taint(&n) && ready_boot_id(&n).as_deref() == Some(kubelet.boot_id())
    })
    .await;
    assert!(
        agent.ready().await,
        "no deletion handler: gate only, ready without a node list"
    );

    std::fs::remove_file(&probe).unwrap();
    eventually("re-tainted while down", || async {
        our_taint(&node(&nodes, &node_c).await)
    })
    .await;
    // The agent counts the write once the API server has answered it, which
    // can be after a reader sees the taint.
    eventually("re-taint counted, not ready", || async {
        agent
            .metric("nodegate_agent_taint_adds_total{reason=\"continuous\"}")
            .await
            == Some(1.0)
            && agent.metric("nodegate_agent_ready").await == Some(0.0)
    })
    .await;

    std::fs::write(&probe, b"ok").unwrap();
    eventually("untainted when back", || async {
        !our_taint(&node(&nodes, &node_c).await)
    })
    .await;
    eventually("removal counted", || async {
        agent.metric("nodegate_agent_taint_removals_total").await == Some(2.0)
    })
    .await;
    assert!(!std::fs::exists(dir.path().join("state/nodes.json")).unwrap());
    assert!(agent.term().await.success());
}

/// `--probe-pod`: only a Ready pod with the labels on this node counts, and
/// the agent reacts to the pod watch (the probe period is an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_probe_follows_the_ready_pod_on_this_node() {
    use k8s_openapi::api::core::v1::Pod;
    // In the namespace the probe-pod component grants (kube-system), with a
    // label only this test uses: on a real cluster a pod labelled like the
    // real network agent's would be adopted by its DaemonSet.
    const NS: &str = "kube-system";
    let (c, nodes) = cluster().await;
    let node_p = c.node_name("node-p");
    let node_q = c.name("node-q");
    let app = c.name("cilium");
    let kubelet = c.kubelet(&node_p).await.unwrap();
    kubelet.register().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client(users::ADMIN).await.unwrap(), NS);
    let pod = |base: &str, node: &str, labels: Value| -> (String, Pod) {
        let name = c.name(base);
        c.delete_on_drop("pods", NS, &name);
        let pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cilium"}]}
        }))
        .unwrap();
        (name, pod)
    };
    let ready = json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]}});
    let pp = PatchParams::default();
    // Ready, right labels, other node; and ready on this node, other labels.
    for (base, node, labels) in [
        ("cilium-elsewhere", &node_q, json!({"k8s-app": app})),
        ("other-app", &node_p, json!({"k8s-app": "other"})),
    ] {
        let (name, p) = pod(base, node, labels);
        pods.create(&PostParams::default(), &p).await.unwrap();
        pods.patch_status(&name, &pp, &Patch::Merge(ready.clone()))
            .await
            .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let probe_pod = format!("{NS}/k8s-app={app}");
    let args = ["--probe-pod", probe_pod.as_str(), "--probe-period", "1h"];
    let mut agent = Agent::start(&c, &node_p, &dir.path().join("state"), &args).await;
    let series = r#"nodegate_agent_probe_results_total{kind="pod",index="0",result="fail"}"#;
    eventually("tainted", || async {
        our_taint(&node(&nodes, &node_p).await)
    })
    .await;
    eventually("first round failed", || async {
        agent.metric(series).await.unwrap_or(0.0) >= 1.0
    })
    .await;

    // The right pod, not Ready yet: its watch event runs a failing round.
    let (cilium_p, p) = pod("cilium-p", &node_p, json!({"k8s-app": app}));
    pods.create(&PostParams::default(), &p).await.unwrap();
    eventually("round on the pod event", || async {
        agent.metric(series).await.unwrap_or(0.0) >= 2.0
    })
    .await;
    assert!(our_taint(&node(&nodes, &node_p).await), "pod not Ready yet");

    pods.patch_status(&cilium_p, &pp, &Patch::Merge(ready))
        .await
        .unwrap();
    eventually("untainted once the pod is Ready", || async {
        !our_taint(&node(&nodes, &node_p).await)
    })
    .await;
    assert!(agent.term().await.success());
}
