//! The webhook away: its Pods deleted with every node cordoned (the
//! agent's safety net); a replica's node crashing, again and again; a
//! replica's node powered off past the grace period.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use nodegate_e2e::real_nodes::admission::Window;
use nodegate_e2e::real_nodes::harness::{figure, step, wait};
use nodegate_e2e::real_nodes::live::{
    all_nodegate_ready, connected_replica_host, live_node, live_pods, node_names, wait_gated,
};
use nodegate_e2e::real_nodes::objects::{
    NS, boot_id, gated, held_by_node_lifecycle, name_of, phase,
};
use nodegate_e2e::real_nodes::record::{Seen, versions_after};
use nodegate_e2e::real_nodes::scenario::{Ctx, crash_to_new_boot};

/// The webhook's Pods deleted and every node cordoned.
pub(crate) async fn webhook_drained(c: &Ctx) {
    let Ctx { h, client, rec, .. } = c;
    // Every node cordoned, so the replacements stay Pending: nodes still
    // register, the agent's safety net gates them, the webhook comes back.
    step("webhook Pods deleted, nodes drained: a new node registers, the safety net, the Event");
    let cordoned = node_names(client).await;
    h.kubectl(&format!("cordon {}", cordoned.join(" ")));
    h.kubectl(&format!(
        "-n {NS} delete pod -l app.kubernetes.io/name=nodegate-webhook --wait=false"
    ));
    wait("no webhook Pod running", 120, async || {
        (!live_pods(client)
            .await
            .iter()
            .any(|p| name_of(p).starts_with("nodegate-webhook-") && phase(p) != "Pending"))
        .then_some(())
    })
    .await;
    let fail_open_before = h.fail_open();
    let before = rec.last_rv();
    h.cluster(&["add-node", "node4"]);
    let first = wait("node4's first version", 60, async || {
        versions_after(rec, "node4", before).into_iter().next()
    })
    .await;
    assert!(!gated(&first.obj), "node4 was gated without a webhook?");
    assert!(
        h.fail_open() > fail_open_before,
        "the registration did not fail open"
    );
    wait_gated(client, "node4", true, 120).await;
    wait(
        "the NodegateWebhookMissed Event for node4",
        60,
        async || {
            let ev =
                h.kubectl("get events -A --field-selector reason=NodegateWebhookMissed -o json");
            ev.contains("node4").then_some(())
        },
    )
    .await;
    h.kubectl(&format!("uncordon {}", cordoned.join(" ")));
    h.cluster(&["ready", "node4"]);
    all_nodegate_ready(client, 2).await;
    wait_gated(client, "node4", false, 120).await;
}

/// Nodes that host a webhook replica crash, one after the other, each
/// time while canaries register, each time the replica the API server is
/// connected to: the backup lines catch every call the dead replica fails.
pub(crate) async fn webhook_host_crash(c: &Ctx) {
    let Ctx {
        h, client, prober, ..
    } = c;
    let runs: usize = std::env::var("NODEGATE_REAL_NODES_CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut first_line_failed = 0;
    for run in 0..runs {
        step(&format!(
            "a webhook replica's node crashes ({}/{runs}): no Node left ungated",
            run + 1
        ));
        let host = connected_replica_host(h, client).await;
        let window = Window::open(h, prober);
        let mark = prober.mark();
        let crash = crash_to_new_boot(c, &host, &[]).await;
        crash.assert_gated(&format!("run {run}"));
        wait_gated(client, &host, true, 120).await;
        h.cluster(&["ready", &host]);
        all_nodegate_ready(client, 2).await;
        wait_gated(client, &host, false, 120).await;
        wait("20 canaries in the run", 60, async || {
            (prober.since(mark).0 >= 20).then_some(())
        })
        .await;
        let what = format!("webhook_host_crash_{run}");
        first_line_failed += window
            .close_none_ungated(h, prober, &what, 20)
            .first_line_fail_open;
    }
    figure("webhook_host_crash_runs", runs);
    figure(
        "webhook_host_crash_first_line_fail_open_total",
        first_line_failed,
    );
}

/// A replica's node powered off and unreachable (no RST: calls time
/// out) for 60 s, past the node lifecycle controller's grace period, then
/// booted again: no Node left ungated, its own re-registration gated.
pub(crate) async fn webhook_host_down(c: &Ctx) {
    let Ctx {
        h,
        client,
        rec,
        prober,
        ..
    } = c;
    step("a webhook replica's node down for 60 s, unreachable: no Node left ungated");
    let host = connected_replica_host(h, client).await;
    let window = Window::open(h, prober);
    let t0 = Instant::now();
    // Unreachable first: the killed processes' FINs never arrive, as when
    // the power goes.
    h.cluster(&["unreachable", &host, "on"]);
    h.cluster(&["stop", &host]);
    // Down for 60 s: a deadline to reach, not a synchronisation.
    let not_ready = wait(&format!("{host} NotReady"), 120, async || {
        let n = live_node(client, &host).await?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status != "True").then(|| t0.elapsed())
    })
    .await;
    figure(
        "webhook_host_down_not_ready_after_ms",
        not_ready.as_millis(),
    );
    tokio::time::sleep_until((t0 + Duration::from_secs(60)).into()).await;
    // Boots it: a new boot ID, reachable again. (Down, it wrote nothing: the
    // stored Node still names the old boot.)
    let crash = crash_to_new_boot(c, &host, &[]).await;
    figure(
        "webhook_host_down_first_new_boot_version_gated",
        gated(&crash.first.obj),
    );
    // Back after the grace period, the kubelet's fast status update
    // (`fastNodeStatusUpdate`, pkg/kubelet/kubelet_node_status.go: the stored
    // Node is not Ready) may precede its create: then the first version of
    // the new boot is a status write, which no admission can taint. It still
    // carries the node lifecycle controller's unreachable/not-ready taint, and
    // the webhook's `Rule::StatusShowsReboot` must put the gate on before that taint goes.
    let gate_at = wait_gated(client, &host, true, 120).await;
    let new_boot: Vec<Seen<Node>> = versions_after(rec, &host, crash.before)
        .into_iter()
        .filter(|s| boot_id(&s.obj).is_some_and(|b| b != crash.old_boot) && s.at <= gate_at)
        .collect();
    let open: Vec<u64> = new_boot
        .iter()
        .take_while(|s| !gated(&s.obj))
        .filter(|s| !held_by_node_lifecycle(&s.obj))
        .map(|s| s.rv)
        .collect();
    figure(
        "webhook_host_down_new_boot_versions_before_gate",
        new_boot.iter().take_while(|s| !gated(&s.obj)).count(),
    );
    assert!(
        open.is_empty(),
        "{host} schedulable on its new boot without the gate: versions {open:?}"
    );
    h.cluster(&["ready", &host]);
    all_nodegate_ready(client, 2).await;
    wait_gated(client, &host, false, 120).await;
    window.close_none_ungated(h, prober, "webhook_host_down", 20);
}
