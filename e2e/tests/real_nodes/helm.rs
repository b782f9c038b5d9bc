//! The install and removal a new user runs from the README: the kustomize
//! removal with a node gated at that moment, `helm install` and `helm
//! test`, a join and a crash reboot under the chart, `helm upgrade` to a
//! new image and `helm rollback` with canaries registering, a switch of
//! key profile and back, and `helm uninstall`. Each removal must leave no
//! gate on any node, no admission object, and a new pod Running on every
//! node within 30 s of the command returning.

use std::time::{Duration, Instant};

use nodegate_e2e::readme::readme_command;
use nodegate_e2e::real_nodes::admission::Window;
use nodegate_e2e::real_nodes::harness::{figure, ok, step, wait};
use nodegate_e2e::real_nodes::live::{
    all_nodegate_ready, live_node, live_pods, node_names, wait_gated, wait_no_pod, workload,
};
use nodegate_e2e::real_nodes::objects::{GATE, NS, gated, name_of, node_of, pod_ready, taints};
use nodegate_e2e::real_nodes::record::versions_after;
use nodegate_e2e::real_nodes::scenario::{Ctx, crash_to_new_boot, ready_and_ungated};

/// Every key nodegate ships (the removal's and the check's list).
fn shipped_keys() -> Vec<String> {
    nodegate_certs::cli::shipped_gate_keys()
}

/// Nodes carrying any of nodegate's keys, with the taints.
async fn nodes_with_gates(c: &Ctx) -> Vec<(String, Vec<(String, String)>)> {
    let keys = shipped_keys();
    let mut out = Vec::new();
    for n in node_names(&c.client).await {
        let t = taints(&live_node(&c.client, &n).await.unwrap());
        if t.iter().any(|(k, _)| keys.contains(k)) {
            out.push((n, t));
        }
    }
    out
}

/// nodegate's admission objects left in the cluster.
fn admission_objects(c: &Ctx) -> Vec<String> {
    let kinds = "mutatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings";
    let mut all: Vec<String> =
        c.h.kubectl(&format!("get {kinds} -o name"))
            .lines()
            .filter(|l| l.contains("/nodegate"))
            .map(str::to_owned)
            .collect();
    // Served from Kubernetes 1.36 (or with the beta API on).
    let out =
        c.h.sh("kubectl get mutatingadmissionpolicies,mutatingadmissionpolicybindings -o name");
    if out.status.success() {
        all.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("/nodegate"))
                .map(str::to_owned),
        );
    }
    all
}

/// `node3` crash-rebooted with its network agent not ready: gated.
async fn a_gated_node(c: &Ctx) -> String {
    let crash = crash_to_new_boot(c, "node3", &[]).await;
    crash.assert_gated("before the removal");
    wait_gated(&c.client, "node3", true, 60).await;
    // Up again (its kubelet reports Ready), only its agent not ready: a
    // removal's Pod may land there as anywhere.
    wait("node3 Ready on its new boot", 120, async || {
        let n = live_node(&c.client, "node3").await?;
        n.status?
            .conditions?
            .iter()
            .any(|k| k.type_ == "Ready" && k.status == "True")
            .then_some(())
    })
    .await;
    "node3".into()
}

/// Runs the README's removal `command`, then: every gate off every node
/// (`gated` included, whose agent never got ready), no admission object,
/// and a new pod through the scheduler Running on every node, each within
/// 30 s of the command returning.
async fn removal(c: &Ctx, what: &str, command: &str, gated_node: &str) {
    step(&format!("{what}: `{command}` with {gated_node} gated"));
    println!("$ {command}");
    let t_cmd = Instant::now();
    ok(command, c.h.sh(command));
    let returned = Instant::now();
    figure(
        &format!("{what}_command_ms"),
        (returned - t_cmd).as_millis(),
    );
    let nodes = node_names(&c.client).await;
    wait("no node carrying a nodegate gate", 30, async || {
        nodes_with_gates(c).await.is_empty().then_some(())
    })
    .await;
    figure(
        &format!("{what}_to_no_gate_ms"),
        returned.elapsed().as_millis(),
    );
    wait("no nodegate admission object", 30, async || {
        admission_objects(c).is_empty().then_some(())
    })
    .await;
    // The gated node's network agent comes up only now that its gate is
    // gone: what opened it was the removal, not its agent (deleted first).
    // Until then Cilium's operator keeps its own taint there, which is not
    // nodegate's to lift.
    c.h.cluster(&["ready", gated_node]);
    let name = what.replace('_', "-");
    for n in &nodes {
        c.h.kubectl(&format!(
            "apply -f - <<'EOF'\n{}EOF",
            workload(&format!("after-{name}-{n}"), n, 1)
        ));
    }
    wait("a new pod Running on every node", 30, async || {
        let pods = live_pods(&c.client).await;
        nodes
            .iter()
            .all(|n| {
                pods.iter().any(|p| {
                    name_of(p).starts_with(&format!("after-{name}-{n}-"))
                        && node_of(p) == Some(n.as_str())
                        && pod_ready(p)
                })
            })
            .then_some(())
    })
    .await;
    let all_running = returned.elapsed();
    figure(
        &format!("{what}_to_pods_running_on_every_node_ms"),
        all_running.as_millis(),
    );
    assert!(
        all_running <= Duration::from_secs(30),
        "{what}: pods ran on every node only {all_running:?} after the command returned"
    );
    // The namespace's own objects go as the namespace controller gets to
    // them (the webhook's Pods have 30 s to stop), and the removal's own
    // credential with the namespace: the check lists them until then.
    let report = wait(
        "nodegate-check --after-uninstall passing",
        180,
        async || {
            let check = c.h.sh("nodegate-check --after-uninstall");
            check
                .status
                .success()
                .then(|| String::from_utf8_lossy(&check.stdout).into_owned())
        },
    )
    .await;
    println!("{report}");
    figure(
        &format!("{what}_to_after_uninstall_check_passed_ms"),
        returned.elapsed().as_millis(),
    );
    for n in &nodes {
        c.h.kubectl(&format!(
            "-n default delete deployment after-{name}-{n} --wait=false"
        ));
    }
    wait_no_pod(&c.client, &format!("after-{name}-")).await;
    assert!(
        !gated(&live_node(&c.client, gated_node).await.unwrap()),
        "{gated_node} is gated again"
    );
}

/// The README's kustomize removal, then its Helm install, `helm test`,
/// a join and a crash reboot, upgrade, rollback, a profile switch and back,
/// `helm uninstall`; finally the kustomize install again for the suites'
/// real-cluster mode.
pub(crate) async fn helm(c: &Ctx) {
    let kustomize_removal = readme_command("## Uninstall", false).unwrap();
    let gated_node = a_gated_node(c).await;
    removal(c, "kustomize_removal", &kustomize_removal, &gated_node).await;
    wait("the namespace gone", 120, async || {
        (!c.h
            .sh(&format!("kubectl get namespace {NS}"))
            .status
            .success())
        .then_some(())
    })
    .await;

    install(c).await;
    join_and_reboot(c).await;
    upgrades(c).await;
}

/// From an install by the chart: upgrade and rollback, a profile switch and
/// back, `helm uninstall`, and the kustomize install again for the suites'
/// real-cluster mode (`NODEGATE_REAL_NODES_ONLY=helm-upgrade` starts here).
pub(crate) async fn upgrades(c: &Ctx) {
    upgrade_and_rollback(c).await;
    profile(c).await;

    let gated_node = a_gated_node(c).await;
    removal(
        c,
        "helm_uninstall",
        &readme_command("## Uninstall", true).unwrap(),
        &gated_node,
    )
    .await;

    step("the kustomize install again (README), for the suites' real-cluster mode");
    let t0 = Instant::now();
    let install = readme_command("## Install", false).unwrap();
    ok(&install, c.h.sh(&install));
    all_nodegate_ready(&c.client, 2).await;
    wait("lines calling the token", 180, async || {
        c.h.kubectl("get mutatingwebhookconfiguration nodegate -o jsonpath={.webhooks[*].clientConfig.service.path}")
            .contains("/mutate/")
            .then_some(())
    })
    .await;
    figure("kustomize_install_to_token_ms", t0.elapsed().as_millis());
    let check = c.h.sh("nodegate-check");
    assert!(
        check.status.success(),
        "nodegate-check after the kustomize install:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );

    // The suites' real-cluster mode tries the roster's credential too: the
    // install as the run had it before this group, with pruning.
    step("the pruning component again, for the suites' real-cluster mode");
    crate::install::my_nodegate(&c.h, "../manifests", &["pruning"]);
    c.h.kubectl("apply -k my-nodegate/");
    c.h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    wait("the roster's Lease", 180, async || {
        c.h.sh(&format!("kubectl -n {NS} get lease nodegate-roster"))
            .status
            .success()
            .then_some(())
    })
    .await;
    for n in node_names(&c.client).await {
        wait_gated(&c.client, &n, false, 120).await;
    }
}

/// The key-profile switch by `helm upgrade --set profile=…` and back, on a
/// Helm install (`NODEGATE_REAL_NODES_ONLY=helm-profile` on a kept cluster
/// with the chart installed): every node re-gated while the agents roll, no
/// call failed open while the replicas roll (a node an old replica gated
/// with the old key does not call the backup lines: stand-ins), no stale
/// key, and the next reboot gated with the new key.
pub(crate) async fn profile(c: &Ctx) {
    profile_switch(c, "node3").await;
}

/// `helm install` as the README has it, then `helm test` until it passes.
async fn install(c: &Ctx) {
    let command = readme_command("## Install", true).unwrap();
    step(&format!(
        "helm install (README): `{command}`, then helm test"
    ));
    let t0 = Instant::now();
    ok(&command, c.h.sh(&command));
    all_nodegate_ready(&c.client, 2).await;
    // The certificates controller moves the lines to the token once both
    // replicas run; helm test passes from then on.
    let logs = wait("helm test passing", 300, async || {
        let out = c.h.sh(&format!("helm test nodegate -n {NS} --logs"));
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .await;
    println!("{logs}");
    figure(
        "helm_install_to_helm_test_passed_ms",
        t0.elapsed().as_millis(),
    );
    for n in node_names(&c.client).await {
        wait_gated(&c.client, &n, false, 120).await;
    }
}

/// A node joins and then crash-reboots under the chart: gated from its
/// first stored version each time, opened once its agent is ready.
async fn join_and_reboot(c: &Ctx) {
    // A node name the harness has not used yet (`node9`, `node10`, …).
    let node = c.h.fresh_node(9);
    let node = node.as_str();
    step(&format!(
        "helm: {node} joins gated from its first version; its crash reboot too"
    ));
    let before = c.rec.last_rv();
    c.h.cluster(&["add-node", node]);
    let first = wait("the new node's first version", 90, async || {
        versions_after(&c.rec, node, before).into_iter().next()
    })
    .await;
    assert!(
        gated(&first.obj),
        "{node} joined ungated: {:?}",
        taints(&first.obj)
    );
    ready_and_ungated(c, node, "helm_join_ready_to_untaint_ms").await;
    let window = Window::open(&c.h, &c.prober);
    let crash = crash_to_new_boot(c, node, &[]).await;
    crash.assert_gated("helm: the new node's crash reboot");
    ready_and_ungated(c, node, "helm_reboot_ready_to_untaint_ms").await;
    window.close_none_open(&c.h, &c.prober, "helm_reboot");
}

/// Every node re-gated by its agent's rollout (any of nodegate's keys:
/// a profile switch rolls agents of the old key) and open again, none left
/// with a stale key, no call failed open.
async fn rolled(c: &Ctx, what: &str, before: u64, window: Window, regate: bool) {
    c.h.kubectl(&format!(
        "-n {NS} rollout status daemonset/nodegate-agent --timeout=300s"
    ));
    c.h.kubectl(&format!(
        "-n {NS} rollout status statefulset/nodegate-webhook --timeout=300s"
    ));
    all_nodegate_ready(&c.client, 2).await;
    let nodes = node_names(&c.client).await;
    let keys = shipped_keys();
    let mut regated = 0;
    for n in &nodes {
        wait_gated(&c.client, n, false, 120).await;
        let was = versions_after(&c.rec, n, before)
            .iter()
            .any(|v| taints(&v.obj).iter().any(|(k, _)| keys.contains(k)));
        assert!(
            !regate || was,
            "{what}: {n} was not re-gated while its agent rolled"
        );
        regated += usize::from(was);
    }
    figure(&format!("{what}_nodes_regated_of_{}", nodes.len()), regated);
    window.close_none_open(&c.h, &c.prober, what);
    assert_eq!(nodes_with_gates(c).await, vec![], "{what}: a stale gate");
    let check = c.h.sh("nodegate-check");
    assert!(
        check.status.success(),
        "nodegate-check after {what}:\n{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// `helm upgrade` to a new image reference, then `helm rollback`.
async fn upgrade_and_rollback(c: &Ctx) {
    step("helm upgrade to a rebuilt image, then helm rollback; canaries throughout");
    // Every image rebuilt under a new tag (a new config: a new digest), on
    // every node, as a registry serves a rebuild: every Pod's template changes.
    c.h.cluster(&["rebuild", "0.1.0-rebuilt"]);
    let t0 = Instant::now();
    let before = c.rec.last_rv();
    let window = Window::open(&c.h, &c.prober);
    ok(
        "helm upgrade",
        c.h.sh(&format!("helm upgrade nodegate charts/nodegate -n {NS} --reuse-values --set image.tag=0.1.0-rebuilt")),
    );
    rolled(c, "helm_upgrade", before, window, true).await;
    assert!(
        c.h.kubectl(&format!("-n {NS} get daemonset nodegate-agent -o jsonpath={{.spec.template.spec.containers[0].image}}"))
            .ends_with(":0.1.0-rebuilt")
    );
    figure("helm_upgrade_ms", t0.elapsed().as_millis());
    let t0 = Instant::now();
    let before = c.rec.last_rv();
    let window = Window::open(&c.h, &c.prober);
    ok(
        "helm rollback",
        c.h.sh(&format!("helm rollback nodegate -n {NS} --wait")),
    );
    rolled(c, "helm_rollback", before, window, true).await;
    figure("helm_rollback_ms", t0.elapsed().as_millis());
}

/// `helm upgrade --set profile=karpenter`, then back to the default.
async fn profile_switch(c: &Ctx, node: &str) {
    for (profile, key) in [
        ("karpenter", "readiness.k8s.io/nodegate-agent-not-ready"),
        ("default", GATE),
    ] {
        step(&format!(
            "helm upgrade --set profile={profile}: no stale key, new reboots gated with {key}"
        ));
        let before = c.rec.last_rv();
        let window = Window::open(&c.h, &c.prober);
        ok(
            "helm upgrade",
            c.h.sh(&format!("helm upgrade nodegate charts/nodegate -n {NS} --reuse-values --set profile={profile}")),
        );
        // The new policy lets an old agent put its own key back at shutdown
        // (a stand-in), so every node is re-gated while the agents roll.
        rolled(c, &format!("profile_{profile}"), before, window, true).await;
        let crash = crash_to_new_boot(c, node, &[]).await;
        wait("the new node gated with the new key", 60, async || {
            let t = taints(&live_node(&c.client, node).await.unwrap());
            t.iter().any(|(k, _)| k == key).then_some(())
        })
        .await;
        drop(crash);
        c.h.cluster(&["ready", node]);
        wait("the new node open again", 120, async || {
            nodes_with_gates(c).await.is_empty().then_some(())
        })
        .await;
    }
}
