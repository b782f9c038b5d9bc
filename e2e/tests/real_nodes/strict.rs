//! Strict mode on the real nodes (`manifests/components/strict-mode`): the
//! boot gate `nodegate.dev/agent-not-ready:NoExecute` comes with a new boot
//! only, so the kubelet of a rebooted node refuses the pods bound to it
//! until its agent is ready, and nothing on the same boot evicts. Each
//! workload kind's fate is printed as figures for docs/strict-mode.md.

use k8s_openapi::api::batch::v1::Job;

use std::collections::BTreeSet;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use nodegate_e2e::real_nodes::harness::{figure, step, wait};
use nodegate_e2e::real_nodes::live::{
    agent_pod, all_nodegate_ready, lease_renewals, live_node, live_pods, node_names,
    restart_counts, stolen_agent_client, wait_gated, wait_no_pod,
};
use nodegate_e2e::real_nodes::objects::{
    GATE, NS, boot_gated, name_of, node_of, phase, pod_ready, taints_json, uid_of,
};
use nodegate_e2e::real_nodes::record::{Recorder, Seen, first_version, gated_windows};
use nodegate_e2e::real_nodes::scenario::{Ctx, crash_to_new_boot, ready_and_ungated};
use serde_json::json;

use crate::forged::forged_reviews;
use crate::install::my_nodegate;
use crate::strict_workloads::{
    LABEL, TOLERATING, is_strict_workload, place, place_and_crash, started_again, workloads,
};

/// Which install `my-nodegate/` holds.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Install {
    Default,
    Strict,
    StrictAdmissionPolicy,
}

pub(crate) async fn strict_mode(c: &Ctx) {
    let node = "node3";
    assert!(
        node_names(&c.client).await.iter().any(|n| n == node),
        "{node} is gone"
    );
    switch(c, Install::Strict).await;
    forged_reviews(c, node, "strict").await;
    crate::token::rotation(c, "strict").await;
    crate::token::token_in_logs(&c.h, "strict_rotation");
    stolen_token_cannot_evict(c, node).await;
    // The boot gate follows the stored new boot, not the re-registration's
    // claim: what that costs, over 10 crash reboots. With the taint-eviction
    // controller every untolerating pod is refused or evicted before the
    // agent is ready; those the kubelet admitted before the gate was stored
    // started first.
    let mut started = Vec::new();
    for i in 1..=10 {
        let label = if i == 1 {
            "strict".to_string()
        } else {
            format!("strict_cost_{i}")
        };
        let (fig, _) = place_and_crash(c, node, &label, true).await;
        started.push(fig.started_before_ready);
    }
    figure(
        "strict_10_crashes_started_before_ready",
        started.iter().sum::<usize>(),
    );
    figure(
        "strict_10_crashes_with_a_start",
        started.iter().filter(|n| **n > 0).count(),
    );
    println!("strict mode, untolerating pods started before the agent, per crash: {started:?}");
    // The kubelet alone, without the taint-eviction controller: it must
    // see the gate when it admits the pods bound to it.
    c.h.cluster(&["kcm", "--controllers=*,-taint-eviction-controller"]);
    let (fig, _) = place_and_crash(c, node, "strict_kubelet_only", false).await;
    c.h.cluster(&["kcm"]);
    // The DaemonSet controller deletes its own pod from a node whose
    // NoExecute taint it does not tolerate; the kubelet refuses the rest,
    // but for those it admitted before the gate was stored (a figure).
    assert!(
        fig.deleted.iter().all(|n| n.starts_with("strict-ds-")),
        "without the eviction controller only the DaemonSet's pod is deleted: deleted {:?}",
        fig.deleted
    );
    agent_rollout(c).await;
    kubelet_restart_on_same_boot(c, node).await;
    webhook_unreachable(c, node).await;
    switch(c, Install::StrictAdmissionPolicy).await;
    let (fig, _) = place_and_crash(c, node, "strict_policy", true).await;
    figure("strict_policy_started", fig.started_before_ready);
    switch(c, Install::Default).await;
    cni_conf_on_tmpfs(c, node).await;
    c.h.kubectl(&format!(
        "delete deploy,sts,job,ds,pod -l {LABEL} --wait=false"
    ));
}

/// Applies `to` as an upgrade users make (`kubectl apply -k`), waits for
/// both rollouts, and asserts that it gated or disrupted nothing: the
/// agents' shutdown re-taint never carries the boot gate.
pub(crate) async fn switch(c: &Ctx, to: Install) {
    let Ctx { h, client, rec, .. } = c;
    step(&format!("switch the install to {to:?}: nothing evicted"));
    let before = rec.last_rv();
    let base = match to {
        Install::StrictAdmissionPolicy => "../manifests/overlays/admission-policy",
        _ => "../manifests",
    };
    let components: &[&str] = match to {
        Install::Default => &["pruning"],
        _ => &["pruning", "strict-mode"],
    };
    if to != Install::StrictAdmissionPolicy {
        // kubectl apply does not prune what the overlay added.
        h.kubectl(
            "delete mutatingadmissionpolicybinding,mutatingadmissionpolicy nodegate --ignore-not-found",
        );
    }
    my_nodegate(h, base, components);
    h.kubectl("apply -k my-nodegate/");
    for w in ["daemonset/nodegate-agent", "statefulset/nodegate-webhook"] {
        h.kubectl(&format!("-n {NS} rollout status {w} --timeout=300s"));
    }
    all_nodegate_ready(client, 2).await;
    for n in node_names(client).await {
        wait_gated(client, &n, false, 120).await;
    }
    if to == Install::StrictAdmissionPolicy {
        // The API server loads a new admission policy asynchronously: until
        // it does, the webhook still taints new nodes (with its warning),
        // and nodegate-check's canary would report the policy as not applied.
        wait("the admission policy in effect", 60, async || {
            let out = h.sh("kubectl create --dry-run=server -o name -f - <<'EOF'\napiVersion: v1\nkind: Node\nmetadata: {name: nodegate-e2e-policy-probe}\nEOF");
            (out.status.success()
                && !String::from_utf8_lossy(&out.stderr).contains("nodegate: added taint"))
            .then_some(())
        })
        .await;
    }
    assert_nothing_disrupted(rec, before, &format!("switch to {to:?}"));
    let check = h.sh("nodegate-check");
    let report = String::from_utf8_lossy(&check.stdout);
    println!("{report}");
    assert!(check.status.success(), "nodegate-check failed in {to:?}");
    let agent_args = h.kubectl(&format!(
        "-n {NS} get ds nodegate-agent -o jsonpath={{.spec.template.spec.containers[0].args}}"
    ));
    assert_eq!(
        agent_args.contains("--boot-taint="),
        to != Install::Default,
        "{to:?}: agent args {agent_args}"
    );
}

/// No workload of this module was deleted, marked for deletion or failed in
/// a version after `since`, and no node carried the boot gate.
pub(crate) fn assert_nothing_disrupted(rec: &Recorder, since: u64, what: &str) {
    let ending = |s: &Seen<Pod>| {
        s.deleted || s.obj.metadata.deletion_timestamp.is_some() || phase(&s.obj) == "Failed"
    };
    // Pods an earlier step already evicted may finish going away later.
    let already: BTreeSet<String> = rec
        .pods()
        .into_iter()
        .filter(|s| s.rv <= since && ending(s))
        .filter_map(|s| s.obj.metadata.uid)
        .collect();
    let disrupted: BTreeSet<String> = rec
        .pods()
        .into_iter()
        .filter(|s| s.rv > since && is_strict_workload(&s.obj) && ending(s))
        .filter(|s| !already.contains(uid_of(&s.obj)))
        .map(|s| name_of(&s.obj).to_string())
        .collect();
    figure(
        &format!("{}_evicted", what.replace(' ', "_")),
        disrupted.len(),
    );
    assert!(disrupted.is_empty(), "{what} disrupted {disrupted:?}");
    let gated: Vec<String> = rec
        .nodes()
        .iter()
        .filter(|s| s.rv > since && boot_gated(&s.obj))
        .filter_map(|s| s.obj.metadata.name.clone())
        .collect();
    assert!(gated.is_empty(), "{what} put the boot gate on {gated:?}");
}

/// The alternative without a taint (strict mode off): the runtime's CNI
/// config directory on a tmpfs, written by the network agent when ready. A
/// crash empties it, so the kubelet creates no pod sandbox on the pod
/// network until the agent is ready: the bound pods wait on the node instead
/// of moving. Measured on the same workloads.
async fn cni_conf_on_tmpfs(c: &Ctx, node: &str) {
    let Ctx { h, client, rec, .. } = c;
    step("strict off, CNI config on tmpfs: a crash reboot, the pods wait on the node");
    let before = place(c, node).await;
    let crash = crash_to_new_boot(c, node, &["--cni-conf-on-tmpfs"]).await;
    let (before_crash, t_crash) = (crash.before, crash.at);
    wait_gated(client, node, true, 120).await;
    // The kubelet has synced its pods (a pod status written on this boot)
    // before the agent is made ready.
    lease_renewals(h, node, 2).await;
    let started = started_again(rec, before_crash, &before, true);
    figure("tmpfs_started_before_ready", started.len());
    println!("  started before the agent was ready: {started:?}");
    let moved: BTreeSet<String> = rec
        .pods()
        .into_iter()
        .filter(|s| s.rv > before_crash && before.contains_key(uid_of(&s.obj)))
        .filter(|s| {
            s.deleted || s.obj.metadata.deletion_timestamp.is_some() || phase(&s.obj) == "Failed"
        })
        .map(|s| name_of(&s.obj).to_string())
        .collect();
    figure("tmpfs_evicted_or_refused", moved.len());
    assert!(
        moved.is_empty(),
        "with strict mode off nothing is evicted: {moved:?}"
    );
    let t_ready = Instant::now();
    ready_and_ungated(c, node, "tmpfs_ready_to_untaint_ms").await;
    // The Job's pod (restartPolicy Never) lost its container with the
    // boot: it fails and the Job makes another; every other pod restarts
    // in place.
    let in_place = before
        .values()
        .filter(|(n, _)| !n.starts_with("strict-job-"))
        .count();
    wait("every workload Ready again", 240, async || {
        let pods = live_pods(client).await;
        let ready = pods
            .iter()
            .filter(|p| is_strict_workload(p) && node_of(p) == Some(node) && pod_ready(p))
            .filter(|p| !name_of(p).starts_with("strict-job-"))
            .count();
        let job = pods
            .iter()
            .any(|p| name_of(p).starts_with("strict-job-") && pod_ready(p));
        (ready == in_place && job).then_some(())
    })
    .await;
    figure(
        "tmpfs_ready_to_workloads_ready_ms",
        t_ready.elapsed().as_millis(),
    );
    figure(
        "tmpfs_workloads_ready_after_crash_ms",
        t_crash.elapsed().as_millis(),
    );
    let job: Job = Api::namespaced(client.clone(), "default")
        .get("strict-job")
        .await
        .unwrap();
    figure(
        "tmpfs_job_failed_pods",
        job.status.and_then(|s| s.failed).unwrap_or(0),
    );
}

/// A rollout of the agent DaemonSet on every node: each old agent's
/// shutdown re-taint adds the ordinary taint only.
async fn agent_rollout(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    step("strict: an agent rollout evicts nothing");
    h.kubectl(&format!(
        "delete deploy,sts,job,ds,pod -l {LABEL} --wait=true --timeout=120s"
    ));
    h.kubectl(&format!("apply -f - <<'EOF'\n{}EOF", workloads("node3")));
    wait("the strict workloads Ready", 180, async || {
        let pods: Vec<Pod> = live_pods(client)
            .await
            .into_iter()
            .filter(|p| is_strict_workload(p) && p.metadata.deletion_timestamp.is_none())
            .collect();
        (pods.len() >= 7 && pods.iter().all(pod_ready)).then_some(())
    })
    .await;
    let before = rec.last_rv();
    let t0 = Instant::now();
    h.kubectl(&format!("-n {NS} rollout restart daemonset/nodegate-agent"));
    h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    let nodes = node_names(client).await;
    for n in &nodes {
        wait_gated(client, n, false, 120).await;
    }
    figure(
        "strict_agent_rollout_gated_nodes",
        nodes.iter().flat_map(|n| gated_windows(rec, n, t0)).count(),
    );
    assert_nothing_disrupted(rec, before, "strict agent rollout");
}

/// The kubelet restarted on the same boot: it re-registers, the webhook
/// sees no new boot.
async fn kubelet_restart_on_same_boot(c: &Ctx, node: &str) {
    let Ctx { h, client, rec, .. } = c;
    step("strict: a kubelet restart on the same boot evicts nothing");
    let before = rec.last_rv();
    let restarts_before = restart_counts(client, node).await;
    h.cluster(&["kubelet-restart", node]);
    lease_renewals(h, node, 2).await;
    assert_nothing_disrupted(rec, before, "strict kubelet restart");
    assert_eq!(
        restart_counts(client, node).await,
        restarts_before,
        "a kubelet restart restarted pods"
    );
}

/// The webhook unreachable (scaled to zero; failurePolicy Ignore): a crash
/// reboot is gated by the agent's start-up safety net only, which runs after
/// the kubelet has admitted the bound pods. Measured, not hidden: the
/// figures show how many started before the gate and were evicted after.
async fn webhook_unreachable(c: &Ctx, node: &str) {
    let Ctx { h, client, rec, .. } = c;
    step("strict with the webhook unreachable: the safety net's gate comes late");
    let before = place(c, node).await;
    h.kubectl(&format!(
        "-n {NS} scale statefulset nodegate-webhook --replicas=0"
    ));
    wait_no_pod(client, "nodegate-webhook-").await;
    let crash = crash_to_new_boot(c, node, &[]).await;
    let (before_crash, t_crash) = (crash.before, crash.at);
    let gate = first_version(
        rec,
        node,
        before_crash,
        "the safety net's boot gate",
        180,
        boot_gated,
    )
    .await;
    figure(
        "strict_no_webhook_crash_to_boot_gate_ms",
        (gate.at - t_crash).as_millis(),
    );
    let started = started_again(rec, before_crash, &before, false);
    figure("strict_no_webhook_started_before_gate", started.len());
    println!("  started before the safety net's gate: {started:?}");
    // Whatever started is evicted by the taint-eviction controller.
    wait(
        "no untolerating workload left on the node",
        180,
        async || {
            (!live_pods(client).await.iter().any(|p| {
                is_strict_workload(p)
                    && node_of(p) == Some(node)
                    && !name_of(p).starts_with(TOLERATING)
                    && p.metadata.deletion_timestamp.is_none()
                    && phase(p) != "Failed"
            }))
            .then_some(())
        },
    )
    .await;
    figure(
        "strict_no_webhook_node_cleared_after_crash_ms",
        t_crash.elapsed().as_millis(),
    );
    assert!(boot_gated(&live_node(client, node).await.unwrap()));
    h.kubectl(&format!(
        "-n {NS} scale statefulset nodegate-webhook --replicas=2"
    ));
    all_nodegate_ready(client, 2).await;
    ready_and_ungated(c, node, "strict_no_webhook_ready_to_untaint_ms").await;
}

/// The agent's token of `node`, stolen in strict mode on a ready node: the
/// boot gate cannot be added and the recorded boot cannot be moved or
/// removed (dry-run; a refusal is what is asserted).
async fn stolen_token_cannot_evict(c: &Ctx, node: &str) {
    let Ctx { h, client, .. } = c;
    step("strict: the agent's stolen token cannot put the boot gate on its ready node");
    let thief = stolen_agent_client(h, &agent_pod(client, node).await).await;
    let nodes: Api<Node> = Api::all(thief);
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let ann = "/metadata/annotations/nodegate.dev~1ready-boot-id";
    // The whole list: a ready node may have no `taints` field to add into.
    let mut with_gate = taints_json(&live_node(client, node).await.unwrap());
    with_gate.push(json!({"key": GATE, "value": "true", "effect": "NoExecute"}));
    let attempts = [
        (
            "add the boot gate",
            json!([{"op": "add", "path": "/spec/taints", "value": with_gate}]),
            "may add the boot gate",
        ),
        (
            "remove the recorded boot",
            json!([{"op": "remove", "path": ann}]),
            "only to the node's current bootID",
        ),
        // The webhook sees a write whose recorded boot differs from the
        // node's, takes it for a reboot and adds the taints to it: the
        // policy refuses the gate, or (its checks since the gates
        // declaration) the moved annotation first. Either refusal holds.
        (
            "move the recorded boot",
            json!([{"op": "replace", "path": ann, "value": "another-boot"}]),
            "may add the boot gate|only to the node's current bootID",
        ),
    ];
    for (what, ops, needles) in attempts {
        let p: json_patch::Patch = serde_json::from_value(ops).unwrap();
        match nodes.patch(node, &dry, &Patch::<()>::Json(p)).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 403, "{what}: {}", e.message);
                assert!(
                    needles.split('|').any(|n| e.message.contains(n))
                        && e.message.contains("nodegate-agent-confinement"),
                    "{what}: {}",
                    e.message
                );
                println!("refused as expected: {what}: {}", e.message);
            }
            other => panic!("{what}: not refused: {other:?}"),
        }
    }
}
