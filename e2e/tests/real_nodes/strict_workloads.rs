//! Every kind of workload on one node in strict mode, and what a crash
//! reboot does to each: placed (the other nodes cordoned while they are
//! scheduled), crashed, followed until the node's agent is ready.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use nodegate_e2e::real_nodes::harness::{figure, step, wait};
use nodegate_e2e::real_nodes::live::{live_node, live_pods, node_names};
use nodegate_e2e::real_nodes::objects::{boot_gated, name_of, node_of, phase, pod_ready, uid_of};
use nodegate_e2e::real_nodes::record::{Recorder, Seen, first_version};
use nodegate_e2e::real_nodes::scenario::{Crash, Ctx, crash_to_new_boot, ready_and_ungated};

/// Label of every workload this module creates.
pub(crate) const LABEL: &str = "nodegate-e2e=strict";

/// The DaemonSet that tolerates every taint, as log and metrics agents do.
pub(crate) const TOLERATING: &str = "strict-logs-";

pub(crate) fn is_strict_workload(p: &Pod) -> bool {
    p.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get("nodegate-e2e").map(String::as_str) == Some("strict"))
}

/// The latest start of a container of `p` and its restarts: a later start
/// or more restarts is a container (re)started by the kubelet.
pub(crate) fn starts(p: &Pod) -> (Option<Timestamp>, i32) {
    let cs = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    let at = cs
        .iter()
        .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(|t| t.0)
        .max();
    (at, cs.iter().map(|c| c.restart_count).sum())
}

pub(crate) fn workloads(node: &str) -> String {
    let pod = |name: &str, extra: &str| {
        format!(
            "metadata: {{labels: {{app: {name}, nodegate-e2e: strict}}}}
    spec:
      terminationGracePeriodSeconds: 1{extra}
      containers:
        - {{name: main, image: localhost/pause:1, imagePullPolicy: Never}}"
        )
    };
    let sel = |name: &str| format!("selector: {{matchLabels: {{app: {name}}}}}");
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: strict-deploy, namespace: default, labels: {{nodegate-e2e: strict}}}}
spec:
  replicas: 2
  {}
  template:
    {}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: strict-sts, namespace: default, labels: {{nodegate-e2e: strict}}}}
spec:
  serviceName: strict-sts
  replicas: 1
  {}
  template:
    {}
---
apiVersion: batch/v1
kind: Job
metadata: {{name: strict-job, namespace: default, labels: {{nodegate-e2e: strict}}}}
spec:
  backoffLimit: 6
  template:
    {}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: strict-ds, namespace: default, labels: {{nodegate-e2e: strict}}}}
spec:
  {}
  template:
    {}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: strict-logs, namespace: default, labels: {{nodegate-e2e: strict}}}}
spec:
  {}
  template:
    {}
---
apiVersion: v1
kind: Pod
metadata: {{name: strict-bare, namespace: default, labels: {{app: strict-bare, nodegate-e2e: strict}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  terminationGracePeriodSeconds: 1
  containers:
    - {{name: main, image: localhost/pause:1, imagePullPolicy: Never}}
",
        sel("strict-deploy"),
        pod("strict-deploy", ""),
        sel("strict-sts"),
        pod("strict-sts", ""),
        pod("strict-job", "\n      restartPolicy: Never"),
        sel("strict-ds"),
        pod("strict-ds", ""),
        sel("strict-logs"),
        pod("strict-logs", "\n      tolerations: [{operator: Exists}]"),
    )
}

/// What one crash showed.
pub(crate) struct Fates {
    /// Untolerating pods bound before the crash whose container the kubelet
    /// started again before the agent was ready.
    pub(crate) started_before_ready: usize,
    /// The untolerating pods bound before the crash that were deleted (by
    /// the eviction controller or their DaemonSet's controller) before the
    /// kubelet refused them.
    pub(crate) deleted: Vec<String>,
}

/// Puts every kind of workload on `node` (the other nodes cordoned while
/// they are placed, as nothing pins them), crashes it with its network
/// agent not ready on the new boot, follows each pod until the agent is
/// ready, and prints what happened to each kind as `<label>_*` figures.
pub(crate) async fn place_and_crash(
    c: &Ctx,
    node: &str,
    label: &str,
    evictor: bool,
) -> (Fates, u64) {
    step(&format!(
        "{label}: every kind of workload on {node}, then a crash reboot"
    ));
    let before = place(c, node).await;
    let crash = crash_to_new_boot(c, node, &[]).await;
    let gate = first_version(&c.rec, node, crash.before, "the boot gate", 120, boot_gated).await;
    figure(
        &format!("{label}_crash_to_boot_gate_ms"),
        (gate.at - crash.at).as_millis(),
    );
    figure(
        &format!("{label}_boot_gate_before_new_boot_status"),
        gate.rv <= crash.first.rv,
    );
    // Until the agent is ready: each untolerating pod is refused by the
    // kubelet or evicted by the taint-eviction controller; the tolerating
    // one runs again.
    let settled = refused_or_evicted(c, node, label, crash.before, &before, evictor).await;
    let first_refusal = settled.values().map(|(rv, _, _)| *rv).min().unwrap();
    figure(
        &format!("{label}_boot_gate_before_first_refusal"),
        gate.rv < first_refusal,
    );
    tolerating_runs_again(c, node, label, &crash, &before).await;
    replaced_while_gated(c, node, label, &crash).await;
    // Nothing bound before the crash (re)started before the agent was ready.
    let started = started_again(&c.rec, crash.before, &before, false);
    figure(&format!("{label}_started_before_ready"), started.len());
    println!("  started again before the agent was ready: {started:?}");

    let untaint_rv = ready_and_ungated(c, node, &format!("{label}_ready_to_untaint_ms")).await;
    let t_untaint = Instant::now();
    wait(
        "the DaemonSet's pod Ready on the node again",
        180,
        async || {
            live_pods(&c.client).await.into_iter().find(|p| {
                name_of(p).starts_with("strict-ds-") && node_of(p) == Some(node) && pod_ready(p)
            })
        },
    )
    .await;
    figure(
        &format!("{label}_untaint_to_daemonset_pod_ready_ms"),
        t_untaint.elapsed().as_millis(),
    );
    let fates = Fates {
        started_before_ready: started.len(),
        deleted: settled
            .values()
            .filter(|(_, why, _)| why == "deleted")
            .map(|(_, _, name)| name.clone())
            .collect(),
    };
    (fates, untaint_rv)
}

/// Waits until every untolerating pod `placed` on `node` was refused by the
/// kubelet or deleted in a version after `since` (without the
/// taint-eviction controller, `evictor` false, a pod the kubelet admitted
/// before the gate was stored runs on: started counts as settled), prints
/// how many of each as `<label>_*` figures, and asserts that the node still
/// carried strict mode's boot gate then.
pub(crate) async fn refused_or_evicted(
    c: &Ctx,
    node: &str,
    label: &str,
    since: u64,
    placed: &Placed,
    evictor: bool,
) -> BTreeMap<String, (u64, String, String)> {
    let untolerating: BTreeMap<&String, &String> = placed
        .iter()
        .filter(|(_, (n, _))| !n.starts_with(TOLERATING))
        .map(|(u, (n, _))| (u, n))
        .collect();
    let settled = wait(
        "every untolerating pod of the node refused or evicted",
        180,
        async || {
            let mut out = BTreeMap::new();
            for s in c.rec.pods().into_iter().filter(|s| s.rv > since) {
                let Some(name) = untolerating.get(&uid_of(&s.obj).to_string()) else {
                    continue;
                };
                if let Some(fate) = fate(&s) {
                    out.entry(uid_of(&s.obj).to_string())
                        .or_insert((s.rv, fate, name.to_string()));
                }
            }
            if !evictor {
                let started = started_again(&c.rec, since, placed, false);
                for s in c.rec.pods().into_iter().filter(|s| s.rv > since) {
                    let uid = uid_of(&s.obj).to_string();
                    if let Some(name) = untolerating.get(&uid)
                        && started.contains(*name)
                    {
                        out.entry(uid)
                            .or_insert((s.rv, "started".to_string(), name.to_string()));
                    }
                }
            }
            (out.len() == untolerating.len()).then_some(out)
        },
    )
    .await;
    assert!(
        boot_gated(&live_node(&c.client, node).await.unwrap()),
        "{node} lost the boot gate before its agent was ready"
    );
    let refused = settled
        .values()
        .filter(|(_, w, _)| w.starts_with("refused"))
        .count();
    figure(&format!("{label}_refused_by_kubelet"), refused);
    figure(
        &format!("{label}_evicted_by_controller_first"),
        settled.len() - refused,
    );
    for (rv, why, name) in settled.values() {
        println!("  {name}: {why} (rv {rv})");
    }
    settled
}

/// What a pod's version says became of it: refused by the kubelet (Failed,
/// with its reason and message) or deleted.
pub(crate) fn fate(s: &Seen<Pod>) -> Option<String> {
    let status = s.obj.status.as_ref();
    if phase(&s.obj) == "Failed" {
        Some(format!(
            "refused: {} {}",
            status.and_then(|s| s.reason.clone()).unwrap_or_default(),
            status.and_then(|s| s.message.clone()).unwrap_or_default()
        ))
    } else if s.deleted || s.obj.metadata.deletion_timestamp.is_some() {
        Some("deleted".to_string())
    } else {
        None
    }
}

/// Waits until the DaemonSet pod that tolerates every taint runs again on
/// `node` (Ready, its containers started anew), prints when as a figure and
/// asserts that the boot gate is still on: a tolerating pod runs before
/// its agent is ready.
pub(crate) async fn tolerating_runs_again(
    c: &Ctx,
    node: &str,
    label: &str,
    crash: &Crash,
    placed: &Placed,
) {
    let tolerating_started = wait(
        "the tolerating DaemonSet pod running again on the node",
        180,
        async || {
            live_pods(&c.client).await.into_iter().find(|p| {
                name_of(p).starts_with(TOLERATING)
                    && node_of(p) == Some(node)
                    && pod_ready(p)
                    && placed.get(uid_of(p)).is_none_or(|(_, s)| starts(p) != *s)
            })
        },
    )
    .await;
    figure(
        &format!("{label}_tolerating_pod_running_after_crash_ms"),
        crash.at.elapsed().as_millis(),
    );
    println!(
        "  {} (tolerates the gate) runs before the agent is ready",
        name_of(&tolerating_started)
    );
    assert!(boot_gated(&live_node(&c.client, node).await.unwrap()));
}

/// Waits until the controllers' replacements of the refused pods are Ready
/// on other nodes, printing when as figures, while `node` is gated; then
/// asserts that nothing untolerating runs on it.
pub(crate) async fn replaced_while_gated(c: &Ctx, node: &str, label: &str, crash: &Crash) {
    for (prefix, count, what) in [
        ("strict-deploy-", 2, "deployment"),
        ("strict-sts-", 1, "statefulset"),
        ("strict-job-", 1, "job"),
    ] {
        ready_elsewhere(&c.client, prefix, node, count).await;
        figure(
            &format!("{label}_{what}_ready_again_after_crash_ms"),
            crash.at.elapsed().as_millis(),
        );
    }
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), "default");
    let job = jobs.get("strict-job").await.unwrap();
    figure(
        &format!("{label}_job_failed_pods"),
        job.status.and_then(|s| s.failed).unwrap_or(0),
    );
    let live = live_pods(&c.client).await;
    let wheres: Vec<String> = live
        .iter()
        .filter(|p| is_strict_workload(p) && !name_of(p).starts_with("strict-logs"))
        .filter(|p| !name_of(p).starts_with("strict-ds") && pod_ready(p))
        .map(|p| format!("{}@{}", name_of(p), node_of(p).unwrap_or("-")))
        .collect();
    println!("  running while {node} is gated: {wheres:?}");
    assert!(
        live.iter().all(
            |p| !(is_strict_workload(p) && node_of(p) == Some(node) && pod_ready(p))
                || name_of(p).starts_with(TOLERATING)
        ),
        "an untolerating workload runs on gated {node}"
    );
    figure(
        &format!("{label}_bare_pod_lost"),
        !live
            .iter()
            .any(|p| name_of(p) == "strict-bare" && pod_ready(p)),
    );
}

/// Every kind of workload Ready on `node` (the previous set deleted first),
/// placed there by cordoning the other nodes while they are scheduled
/// (nothing pins them).
pub(crate) async fn place(c: &Ctx, node: &str) -> Placed {
    let Ctx { h, client, .. } = c;
    h.kubectl(&format!(
        "delete deploy,sts,job,ds,pod -l {LABEL} --wait=true --timeout=120s"
    ));
    let others: Vec<String> = node_names(client)
        .await
        .into_iter()
        .filter(|n| n != node)
        .collect();
    h.kubectl(&format!("cordon {}", others.join(" ")));
    h.kubectl(&format!("apply -f - <<'EOF'\n{}EOF", workloads(node)));
    let on_node = wait("every strict workload Ready on the node", 180, async || {
        let pods: Vec<Pod> = live_pods(client)
            .await
            .into_iter()
            .filter(|p| is_strict_workload(p) && node_of(p) == Some(node))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        // Deployment 2, StatefulSet 1, Job 1, two DaemonSets, the bare pod.
        (pods.len() == 7 && pods.iter().all(pod_ready)).then_some(pods)
    })
    .await;
    h.kubectl(&format!("uncordon {}", others.join(" ")));
    on_node
        .iter()
        .map(|p| {
            (
                p.metadata.uid.clone().unwrap(),
                (name_of(p).to_string(), starts(p)),
            )
        })
        .collect()
}

/// The pods `place` put on the node: uid → (name, their containers' starts).
pub(crate) type Placed = BTreeMap<String, (String, (Option<Timestamp>, i32))>;

/// Placed pods whose containers (re)started in a version after `since`;
/// the tolerating DaemonSet's pod counts only with `tolerating`.
pub(crate) fn started_again(
    rec: &Recorder,
    since: u64,
    placed: &Placed,
    tolerating: bool,
) -> BTreeSet<String> {
    rec.pods()
        .into_iter()
        .filter(|s| s.rv > since)
        .filter_map(|s| {
            let (name, was) = placed.get(s.obj.metadata.uid.as_deref()?)?;
            let (at, restarts) = starts(&s.obj);
            let again = restarts > was.1 || (at.is_some() && at > was.0);
            (again && (tolerating || !name.starts_with(TOLERATING))).then(|| name.clone())
        })
        .collect()
}

/// Waits until `count` pods named `prefix…` are Ready on nodes other than
/// `node` (a controller's replacements of the pods `node` refused).
pub(crate) async fn ready_elsewhere(client: &kube::Client, prefix: &str, node: &str, count: usize) {
    wait(
        &format!("{count} {prefix}* Ready off {node}"),
        180,
        async || {
            let ready = live_pods(client)
                .await
                .iter()
                .filter(|p| name_of(p).starts_with(prefix) && node_of(p) != Some(node))
                .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
                .count();
            (ready >= count).then_some(())
        },
    )
    .await;
}
